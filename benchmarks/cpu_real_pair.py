"""Our engine over HTTP, plain and speculative, against transformers `generate` on the same
weights: batch 1, greedy, the same prompts, replies ending at EOS, in one run.

The sides are interleaved: each round measures every side once (the order reversed every
other round), and a side's tok/s is the median over rounds of its median decode rate per
reply, (tokens - 1) / (last token - first token), the rate benchmarks/serving.py reports
over HTTP. Ratios are medians of the per-round ratios. Our servers start once, from
step_sweep's command templates (one per side), and stay up between rounds; transformers runs
in this process at every cache implementation, dtype and thread count asked for (its best is
reported). Our engine's thread count is its own (engine/loading.py: cpu_threads). With
--gguf, our sides also run on the GGUF itself with its 4-bit projections kept 4-bit.

  python -m benchmarks.cpu_real_pair --model runs/smollm2-hf --draft shipped/smollm2/drafter \\
      --prompts shipped/smollm2/heldout/chat.jsonl --per-category 1
Writes <out-dir>/<name>.{json,md,png}.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.report import md_table, provenance, pyplot, save_figure, write_json
from benchmarks.step_sweep import BASELINE_CMD, SERVER_CMD, Setting

PROJECT_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = PROJECT_ROOT / "benchmarks" / "results" / "cpu_real_pair"


@dataclass
class Side:
    label: str
    engine: str                 # "ours" | "transformers"
    dtype: str
    steps: int = 0              # ours: 0 plain, N a chain of N steps (topk 1)
    cache: str = "default"      # transformers: cache_implementation
    threads: int = 0            # transformers: torch threads
    q4: bool = False            # ours: the GGUF itself, its 4-bit projections kept 4-bit (--gguf-q4)
    rounds: list[dict] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return statistics.median(r["tok_s"] for r in self.rounds)


def select_records(path: str, per_category: int, limit: int) -> list[dict]:
    """The first `per_category` records of each category, in file order (all records when 0)."""
    recs = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not per_category:
        return recs[:limit]
    seen, out = collections.Counter(), []
    for r in recs:
        seen[r.get("category")] += 1
        if seen[r.get("category")] <= per_category:
            out.append(r)
    return out[:limit]


# -- our engine over HTTP -------------------------------------------------------------------
def server_template(args, side: Side) -> str:
    template = SERVER_CMD if side.steps else BASELINE_CMD
    return f"{template} --dtype {side.dtype} --max-context {args.max_context}" + (" --gguf-q4" if side.q4 else "")


def measure_http(base: str, records: list[dict], max_tokens: int) -> dict:
    from benchmarks import serving

    cfg = serving.BenchConfig(base_url=base, model=None, max_concurrency=1, request_rate=float("inf"),
                              num_prompts=len(records), max_tokens=max_tokens, temperature=0.0,
                              ignore_eos=False, seed=0, timeout_s=600.0)
    res = asyncio.run(serving.run_benchmark(cfg, records))
    s = res["summary"]
    if s["failed"] or not s["decode_tok_s"]:
        raise RuntimeError(f"{base}: {s['failed']} requests failed: {s['errors']}")
    return {"tok_s": s["decode_tok_s"]["median"], "accept_length": s["accept_length_responses"],
            "output_tokens": [r["output_tokens"] for r in res["requests"]]}


# -- transformers ---------------------------------------------------------------------------
class FirstTokenClock:
    """A `generate` streamer that notes when the first new token arrives (the first `put` is
    the prompt)."""

    def __init__(self):
        self.puts, self.first = 0, None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def measure_hf(model, prompts: list[list[int]], side: Side, max_tokens: int, eos: list[int]) -> dict:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(side.threads)
    rates, lengths = [], []
    try:
        for ids in prompts:
            clock = FirstTokenClock()
            x = torch.tensor([ids])
            with torch.inference_mode():
                out = model.generate(x, max_new_tokens=max_tokens, do_sample=False, eos_token_id=eos,
                                     pad_token_id=eos[0], streamer=clock,
                                     cache_implementation=None if side.cache == "default" else side.cache)
            end = time.perf_counter()
            n = out.shape[1] - len(ids)
            lengths.append(n)
            if n > 1:
                rates.append((n - 1) / (end - clock.first))
    finally:
        torch.set_num_threads(before)
    return {"tok_s": statistics.median(rates), "output_tokens": lengths}


# -- the run --------------------------------------------------------------------------------
def build_sides(args) -> list[Side]:
    sides = [Side(f"ours {d} plain", "ours", d) for d in args.dtypes]
    sides += [Side(f"ours {args.spec_dtype} chain {s}", "ours", args.spec_dtype, steps=s) for s in args.steps]
    if args.gguf:
        sides += [Side(f"ours {args.q4_dtype} Q4 plain", "ours", args.q4_dtype, q4=True)]
        sides += [Side(f"ours {args.q4_dtype} Q4 chain {s}", "ours", args.q4_dtype, steps=s, q4=True)
                  for s in args.steps]
    sides += [Side(f"transformers {d} {c} cache, {t} threads", "transformers", d, cache=c, threads=t)
              for t in args.hf_threads for d in args.dtypes for c in args.hf_caches]
    return sides


def run(args, sides: list[Side], records: list[dict]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.engine_speed import encode_prompt
    from benchmarks.server_proc import running_server

    tok = AutoTokenizer.from_pretrained(args.hf_model)
    prompts = [encode_prompt(tok, r.get("messages") or r["prompt"]) for r in records]
    eos = [tok.eos_token_id]
    hf_models = {d: AutoModelForCausalLM.from_pretrained(args.hf_model, dtype=getattr(torch, d)).eval()
                 for d in {s.dtype for s in sides if s.engine == "transformers"}}
    log = Path(args.out_dir) / f"{args.name}-servers.log"
    with contextlib.ExitStack() as stack:
        measure = {}
        for s in sides:
            if s.engine == "ours":
                fields = {"model": args.gguf if s.q4 else args.model, "draft": args.draft, **Setting(s.steps).record()}
                base = stack.enter_context(running_server(server_template(args, s), fields, log, args.server_timeout))
                measure[s.label] = lambda recs, base=base: measure_http(base, recs, args.max_tokens)
            else:
                measure[s.label] = lambda ids, s=s: measure_hf(hf_models[s.dtype], ids, s, args.max_tokens, eos)
        for s in sides:  # warm-up: one reply each, not measured
            measure[s.label](records[:1] if s.engine == "ours" else prompts[:1])
        for i in range(args.rounds):
            for s in (sides if i % 2 == 0 else sides[::-1]):
                load = os.getloadavg()[0]  # other jobs on the machine show here
                s.rounds.append({**measure[s.label](records if s.engine == "ours" else prompts), "load_1min": load})
                print(f"round {i + 1} {s.label:>40} {s.rounds[-1]['tok_s']:7.2f} tok/s", flush=True)


def ratio(a: Side, b: Side) -> float:
    return statistics.median(x["tok_s"] / y["tok_s"] for x, y in zip(a.rounds, b.rounds))


def summarize(sides: list[Side]) -> dict:
    def best(pred):
        return max((s for s in sides if pred(s)), key=lambda s: s.tok_s, default=None)

    ours_fp32 = best(lambda s: s.engine == "ours" and not s.steps and s.dtype == "float32")
    ours_best_plain = best(lambda s: s.engine == "ours" and not s.steps)
    hf_best = best(lambda s: s.engine == "transformers")
    rows = []
    for s in sides:
        same_plain = best(lambda o: o.engine == "ours" and not o.steps and o.dtype == s.dtype)
        same_hf = best(lambda o: o.engine == "transformers" and o.dtype == s.dtype)
        acc = [r["accept_length"] for r in s.rounds if r.get("accept_length")]
        rows.append({
            "side": s.label, "engine": s.engine, "dtype": s.dtype, "steps": s.steps, "cache": s.cache,
            "threads": s.threads or None, "tok_s": s.tok_s, "tok_s_rounds": [r["tok_s"] for r in s.rounds],
            "load_1min_rounds": [r["load_1min"] for r in s.rounds],
            "accept_length": statistics.mean(acc) if acc else None,
            "vs_ours_plain_same_dtype": ratio(s, same_plain) if same_plain else None,
            "vs_ours_plain_fp32": ratio(s, ours_fp32) if ours_fp32 else None,
            "vs_transformers_best_same_dtype": ratio(s, same_hf) if same_hf else None,
            "vs_transformers_best": ratio(s, hf_best) if hf_best else None,
            "output_tokens": s.rounds[0]["output_tokens"]})
    return {"rows": rows, "ours_best_plain": ours_best_plain and ours_best_plain.label,
            "transformers_best": hf_best and hf_best.label}


def markdown(result: dict) -> str:
    rows = [[r["side"], r["tok_s"], " / ".join(f"{x:.1f}" for x in r["tok_s_rounds"]),
             " / ".join(f"{x:.1f}" for x in r["load_1min_rounds"]), r["accept_length"],
             r["vs_ours_plain_same_dtype"], r["vs_ours_plain_fp32"], r["vs_transformers_best_same_dtype"],
             r["vs_transformers_best"]] for r in result["rows"]]
    s = result["settings"]
    same = {d: len({tuple(r["output_tokens"]) for r in result["rows"] if r["dtype"] == d}) == 1
            for d in dict.fromkeys(r["dtype"] for r in result["rows"])}
    return ("# CPU, real pair: our engine over HTTP vs transformers `generate`\n\n"
            f"`{result['provenance']['command']}`\n\n"
            f"model {result['model']} (transformers: {result['hf_model']}), draft {result['draft']}; "
            f"{s['num_prompts']} prompts, max_tokens {s['max_tokens']}, replies end at EOS, batch 1, greedy; "
            f"{s['rounds']} rounds, sides interleaved (order reversed every other round); tok/s = median over "
            f"rounds of the median decode rate per reply; ratios = medians of per-round ratios; load = the "
            f"machine's 1-minute load average before each measurement (this run adds about 1-2).\n\n"
            + md_table(["side", "tok/s", "per round", "load per round", "accept length", "x our plain (same dtype)",
                        "x our plain fp32", "x transformers best (same dtype)", "x transformers best"], rows)
            + f"\nOur best plain: {result['ours_best_plain']}; transformers' best: {result['transformers_best']}. "
            "Reply lengths per prompt (first round), sides of one dtype: "
            + "; ".join(f"{d} {'all equal' if eq else 'NOT all equal'}" for d, eq in same.items())
            + " (JSON: `output_tokens`).\n")


def plot(result: dict, path: Path) -> Path:
    plt = pyplot()
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    colors = ["tab:blue" if r["engine"] == "ours" and not r["steps"] else
              "tab:orange" if r["engine"] == "ours" else "tab:gray" for r in rows]
    lo = [r["tok_s"] - min(r["tok_s_rounds"]) for r in rows]
    hi = [max(r["tok_s_rounds"]) - r["tok_s"] for r in rows]
    ax.barh([r["side"] for r in rows], [r["tok_s"] for r in rows], xerr=[lo, hi], color=colors)
    ax.invert_yaxis()
    ax.set_xlabel("decode tok/s, batch 1 (median of rounds; bars: min-max)")
    ax.set_title("ours plain (blue) and speculative (orange), transformers `generate` (gray)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="target folder our servers load")
    ap.add_argument("--hf-model", help="the same weights for transformers (default: --model)")
    ap.add_argument("--draft", required=True)
    ap.add_argument("--prompts", required=True, help="JSONL of {messages} or {prompt}")
    ap.add_argument("--per-category", type=int, default=0, help="the first N records of each category (0: all)")
    ap.add_argument("--num-prompts", type=int, default=12, help="at most this many prompts")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--steps", default="1,2,3", help="our chains (topk 1)")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="our plain decoding and transformers")
    ap.add_argument("--spec-dtype", default="float32", help="our speculative sides")
    ap.add_argument("--gguf", help="the GGUF --model was written from: adds our sides with its 4-bit weights kept")
    ap.add_argument("--q4-dtype", default="bfloat16", help="those sides' dtype (the float32 int4 CPU kernel is slow)")
    ap.add_argument("--hf-caches", default="default,static", help="transformers cache_implementation values")
    ap.add_argument("--hf-threads", default="0", help="transformers torch threads, comma list (0: torch's default)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-context", type=int, default=1024)
    ap.add_argument("--server-timeout", type=float, default=300.0)
    ap.add_argument("--name", default="smollm2")
    ap.add_argument("--out-dir", default=str(RESULTS_DIR))
    args = ap.parse_args(argv)
    args.hf_model = args.hf_model or args.model
    args.steps = [int(s) for s in args.steps.split(",") if s]
    args.dtypes, args.hf_caches = args.dtypes.split(","), args.hf_caches.split(",")
    import torch
    args.hf_threads = [int(t) or torch.get_num_threads() for t in args.hf_threads.split(",")]
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)

    records = select_records(args.prompts, args.per_category, args.num_prompts)
    sides = build_sides(args)
    run(args, sides, records)
    result = {"model": args.model, "hf_model": args.hf_model, "draft": args.draft,
              "settings": {"prompts": args.prompts, "prompt_ids": [r.get("id") for r in records],
                           "num_prompts": len(records), "max_tokens": args.max_tokens, "rounds": args.rounds,
                           "max_context": args.max_context},
              **summarize(sides), "provenance": provenance(argv)}
    out = Path(args.out_dir)
    paths = [write_json(out / f"{args.name}.json", result), out / f"{args.name}.md", out / f"{args.name}.png"]
    paths[1].write_text(markdown(result))
    plot(result, paths[2])
    print(markdown(result))
    print("wrote " + ", ".join(str(p) for p in paths))
    return result


if __name__ == "__main__":
    main()
