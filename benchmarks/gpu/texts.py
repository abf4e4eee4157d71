"""Greedy texts of held-out chat prompts, three ways, and how many two runs share.

  offline  vLLM's offline API (`LLM.generate` on the prompt ids our server would send), engine arguments
           from a profile (default gpu-vllm) exactly as our server passes them; --no-spec: plain decoding
  client   the official openai client against a server, --concurrency requests in flight
  native   the native engine in this process, engine arguments from a profile (default gpu-native) with
           --set native.KEY=VALUE on top (--set native.deterministic=true), --concurrency requests in
           flight: one engine, no HTTP, so two settings compare in one call
  compare  A.json B.json: identical texts (and token counts) prompt by prompt
  smoke    vLLM loads MODEL (no drafter) and generates a few tokens (benchmarks/gpu/vllm_bundle.sh install)

Each run writes JSON: the texts in prompt order, completion tokens, output tok/s over the whole run,
and the accept length (completion tokens / verify steps, bonus token included, the server's
usage.spec_decoding convention; offline from vLLM's spec-decoding counters: 1 + accepted / drafts).

  python -m benchmarks.gpu.texts offline --model runs/smollm2/target --out vllm_eagle.json
  python -m benchmarks.gpu.texts client --base-url http://127.0.0.1:8000 --concurrency 8 --out ours.json
  python -m benchmarks.gpu.texts compare vllm_eagle.json ours.json
"""
from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CHAT = PROJECT_ROOT / "shipped" / "smollm2" / "heldout" / "chat.jsonl"


def read_prompts(path: str | Path, limit: int) -> list[dict]:
    recs = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    recs = [r for r in recs if "messages" in r]
    return recs[:limit] if limit else recs


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The ids our server renders for a chat request (server/prompts.py)."""
    from server.prompts import chat_prompt_ids
    from server.protocol import ChatCompletionRequest

    return chat_prompt_ids(tokenizer, ChatCompletionRequest(model="m", messages=messages))


def vllm_kwargs(profile: str, model: str, draft: str | None, no_spec: bool, steps: int | None) -> dict:
    """LLM(**kwargs): the engine arguments our server would give AsyncLLM for this profile."""
    from launch.cli import vllm_drafter
    from launch.engine_args import vllm_engine_args
    from launch.profiles import Overrides, resolve

    launch = resolve(profile, Overrides(model=model, draft=draft, no_spec=no_spec, steps=steps))
    os.environ.update(launch.env)
    return vllm_engine_args(launch.profile, vllm_drafter(launch, dry_run=False))


def spec_counters(llm) -> tuple[float, float]:
    """(drafts, accepted draft tokens) from vLLM's metrics (0, 0 without speculation)."""
    drafts = accepted = 0.0
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_drafts":
            drafts += m.value
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            accepted += m.value
    return drafts, accepted


def offline(a) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from models.tokenizer import load_tokenizer

    kw = vllm_kwargs(a.profile, a.model, a.draft, a.no_spec, a.steps)
    t0 = time.perf_counter()
    llm = LLM(**kw)
    start_s = time.perf_counter() - t0
    tok = load_tokenizer(a.model)
    recs = read_prompts(a.prompts, a.limit)
    prompts = [TokensPrompt(prompt_token_ids=prompt_ids(tok, r["messages"])) for r in recs]
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, seed=0)
    llm.generate(prompts[:1], params, use_tqdm=False)   # warm-up, not measured
    d0, a0 = spec_counters(llm)
    outs, t0 = [], time.perf_counter()
    batches = [prompts] if a.concurrency == 0 else [[p] for p in prompts]   # 0: all at once; else one by one
    for batch in batches:
        outs += llm.generate(batch, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    d1, a1 = spec_counters(llm)
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    drafts = d1 - d0
    return {"side": "vllm offline", "engine_args": dict(kw), "start_s": start_s,
            "prompts": [r.get("id", i) for i, r in enumerate(recs)],
            "texts": [o.outputs[0].text for o in outs],
            "completion_tokens": [len(o.outputs[0].token_ids) for o in outs],
            "token_ids": [list(o.outputs[0].token_ids) for o in outs],
            "wall_s": wall, "output_tok_s": n / wall,
            "accept_length": (n / drafts if drafts else None),   # verify steps = drafts (one per step a request)
            "accept_length_counters": (1 + (a1 - a0) / drafts) if drafts else None,
            "concurrency": a.concurrency or len(prompts), "max_tokens": a.max_tokens}


def client(a) -> dict:
    from openai import OpenAI

    recs = read_prompts(a.prompts, a.limit)
    api = OpenAI(base_url=a.base_url.rstrip("/") + "/v1", api_key=a.api_key or "none", timeout=600, max_retries=0)
    model = a.model or api.models.list().data[0].id

    def one(rec):
        t = time.perf_counter()
        r = api.chat.completions.create(model=model, messages=rec["messages"], max_tokens=a.max_tokens,
                                        temperature=0.0, seed=0)
        usage = r.usage.model_dump() if r.usage else {}
        return r.choices[0].message.content, usage, time.perf_counter() - t

    one(recs[0])   # warm-up, not measured
    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.concurrency) as pool:
        results = list(pool.map(one, recs))
    wall = time.perf_counter() - t0
    usages = [u for _, u, _ in results]
    n = sum(u.get("completion_tokens", 0) for u in usages)
    spec = [u.get("spec_decoding") for u in usages if u.get("spec_decoding")]
    steps = sum(s.get("verify_steps", 0) for s in spec)
    with_spec = sum(u.get("completion_tokens", 0) for u in usages if u.get("spec_decoding"))
    return {"side": a.side or a.base_url, "model": model, "prompts": [r.get("id", i) for i, r in enumerate(recs)],
            "texts": [t for t, _, _ in results], "completion_tokens": [u.get("completion_tokens") for u in usages],
            "usage": usages, "latency_s": [s for _, _, s in results], "wall_s": wall, "output_tok_s": n / wall,
            "accept_length": (with_spec / steps) if steps else None, "concurrency": a.concurrency,
            "max_tokens": a.max_tokens}


def native(a) -> dict:
    """Greedy texts from the native engine in this process at each --concurrency (requests submitted
    that many at a time, each read to its end, so rows join and leave the batch as a server's do).
    With --turn FILE the measured part waits for an exclusive lock on FILE: engines started side by
    side compile at once and measure one at a time."""
    import asyncio
    import fcntl

    from engine.api import SamplingParams
    from engine.loading import build_engine
    from launch.engine_args import native_engine_args
    from launch.profiles import Overrides, resolve
    from models.tokenizer import load_tokenizer

    settings = {k: json.loads(v) if v in ("true", "false") or v.lstrip("-").isdigit() else v
                for k, v in (kv.split("=", 1) for kv in a.set)}
    launch = resolve(a.profile, Overrides(model=a.model, draft=a.draft, no_spec=a.no_spec, settings=settings))
    os.environ.update(launch.env)
    args = native_engine_args(launch.profile)
    tok = load_tokenizer(args.model)
    recs = read_prompts(a.prompts, a.limit)
    prompts = [prompt_ids(tok, r["messages"]) for r in recs]
    t0 = time.perf_counter()
    engine = build_engine(args)
    params = SamplingParams(temperature=0, max_tokens=a.max_tokens, detokenize=False)

    async def one(i, prompt, gate):
        async with gate:
            ids = []
            async for out in engine.generate(f"r{i}", prompt, params):
                ids += out.token_ids
            return ids

    async def go():
        await engine.start()
        start = time.perf_counter() - t0
        runs = {}
        try:
            with open(a.turn or os.devnull, "a") as turn:
                if a.turn:
                    fcntl.flock(turn, fcntl.LOCK_EX)
                await one(-1, prompts[0], asyncio.Semaphore(1))   # warm-up, not measured
                for c in (int(c) for c in str(a.concurrency).split(",")):
                    gate = asyncio.Semaphore(c)
                    t = time.perf_counter()
                    outs = await asyncio.gather(*(one(i, p, gate) for i, p in enumerate(prompts)))
                    runs[c] = (outs, time.perf_counter() - t)
            return start, runs
        finally:
            await engine.shutdown()
    start_s, runs = asyncio.run(go())
    side = f"native {a.profile}" + (" plain" if a.no_spec else " speculative") + f" {settings}"
    results = {c: {"side": side, "start_s": start_s, "prompts": [r.get("id", i) for i, r in enumerate(recs)],
                   "texts": [tok.decode(ids) for ids in outs], "completion_tokens": [len(ids) for ids in outs],
                   "token_ids": outs, "wall_s": wall, "output_tok_s": sum(map(len, outs)) / wall,
                   "concurrency": c, "max_tokens": a.max_tokens} for c, (outs, wall) in runs.items()}
    for c, r in results.items():   # one file a concurrency: OUT-cC.json
        Path(f"{a.out.removesuffix('.json')}-c{c}.json").write_text(json.dumps(r, indent=1))
    return {"side": side, "start_s": start_s, "output_tok_s": {c: r["output_tok_s"] for c, r in results.items()}}


def compare(a_path: str, b_path: str) -> dict:
    a, b = json.loads(Path(a_path).read_text()), json.loads(Path(b_path).read_text())
    pairs = list(zip(a["texts"], b["texts"]))
    same = [i for i, (x, y) in enumerate(pairs) if x == y]
    differ = [i for i in range(len(pairs)) if i not in same]

    def first_gap(x: str, y: str) -> int:
        return next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))

    return {"a": a_path, "b": b_path, "prompts": len(pairs), "identical": len(same),
            "differ": [{"prompt": a["prompts"][i], "first_char_apart": first_gap(*pairs[i])} for i in differ]}


def smoke(a) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(model=a.model, dtype="bfloat16", max_model_len=512, gpu_memory_utilization=0.1, seed=0,
              compilation_config={"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"})
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    return {"text": out[0].outputs[0].text, "tokens": len(out[0].outputs[0].token_ids)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("offline")
    o.add_argument("--profile", default="gpu-vllm")
    o.add_argument("--model", required=True, help="the target's HF folder")
    o.add_argument("--draft", help="drafter folder (default: the profile's)")
    o.add_argument("--steps", type=int, help="speculative tokens (default: the profile's)")
    o.add_argument("--no-spec", action="store_true")
    o.add_argument("--concurrency", type=int, default=1, help="1: one prompt at a time; 0: all at once")
    c = sub.add_parser("client")
    c.add_argument("--base-url", default="http://127.0.0.1:8000")
    c.add_argument("--model", help="model name (default: the server's)")
    c.add_argument("--api-key")
    c.add_argument("--side", help="a name for this server in the output")
    c.add_argument("--concurrency", type=int, default=1)
    n = sub.add_parser("native")
    n.add_argument("--profile", default="gpu-native")
    n.add_argument("--model", help="target (default: the profile's)")
    n.add_argument("--draft", help="drafter folder (default: the profile's)")
    n.add_argument("--no-spec", action="store_true")
    n.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="profile settings")
    n.add_argument("--concurrency", default="1", help="requests in flight, or a comma list (one run each)")
    n.add_argument("--turn", help="a lock file: measure only while holding it")
    for p in (o, c, n):
        p.add_argument("--prompts", default=str(CHAT))
        p.add_argument("--limit", type=int, default=40, help="the first N prompts (0: all)")
        p.add_argument("--max-tokens", type=int, default=256)
        p.add_argument("--out", required=True)
    m = sub.add_parser("compare")
    m.add_argument("a")
    m.add_argument("b")
    m.add_argument("--out")
    s = sub.add_parser("smoke")
    s.add_argument("--model", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "compare":
        result = compare(a.a, a.b)
    else:
        result = {"offline": offline, "client": client, "native": native, "smoke": smoke}[a.cmd](a)
    out = getattr(a, "out", None)
    if out and a.cmd != "native":
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=1, default=str))
    brief = {k: v for k, v in result.items() if k not in ("texts", "token_ids", "usage", "latency_s", "engine_args",
                                                          "prompts", "completion_tokens")}
    print(json.dumps(brief, default=str)[:1500], flush=True)
    return result


if __name__ == "__main__":
    main()
