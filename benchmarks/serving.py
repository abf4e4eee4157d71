"""Load generator for any OpenAI-compatible server (ours, SGLang, vLLM): latency and accept length.

Streams chat (prompts with `messages`) or text completions (prompts with `prompt`) with
Poisson arrivals (--request-rate, inf = all at once) under a concurrency cap, and reports
vLLM benchmark_serving's metrics:
  TTFT  = first streamed content chunk - request start
  TPOT  = (e2e - TTFT) / (output_tokens - 1)            per request
  ITL   = gaps between successive streamed content chunks (a chunk may carry several tokens
          when a draft run is accepted, so ITL > TPOT with speculation)
  E2E   = last byte - request start
Throughput = completed requests (output tokens) / wall time of the measured run.
Accept length twice: from the responses' usage.spec_decoding (Σcompletion / Σverify steps)
and from /metrics counter deltas around the run (1 + Δaccepted / Δverify).

  python -m benchmarks.serving --base-url http://127.0.0.1:8000 --max-concurrency 1 \
      --num-prompts 32 --max-tokens 256 --out-dir runs/serving
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

from benchmarks import prom_text
from benchmarks.manifest import write_manifest
from benchmarks.report import md_table, provenance, pyplot, save_figure, write_result
from drafter.prompts import read_records

PROJECT_ROOT = Path(__file__).resolve().parent.parent
HELDOUT = PROJECT_ROOT / "shipped" / "data" / "heldout_prompts.jsonl"
FALLBACK_PROMPT = {"messages": [{"role": "user", "content": "Write a Python function that parses a config file."}]}


@dataclass
class RequestResult:
    ok: bool
    start: float = 0.0                 # seconds since the run began
    ttft: float = 0.0                  # seconds
    e2e: float = 0.0                   # seconds
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    chunks: int = 0
    spec: dict | None = None           # usage.spec_decoding of the response
    error: str = ""

    @property
    def tpot(self) -> float | None:
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


@dataclass
class BenchConfig:
    base_url: str
    model: str | None
    max_concurrency: int
    request_rate: float
    num_prompts: int
    max_tokens: int
    temperature: float
    ignore_eos: bool
    seed: int
    timeout_s: float
    api_key: str | None = None


def load_prompts(path: str | None, n: int) -> list[dict]:
    """Records with `messages` (chat) or `prompt` (text); cycled to n. Held-out set by default."""
    p = Path(path) if path else (HELDOUT if HELDOUT.is_file() else None)
    recs = read_records(p) if p else [FALLBACK_PROMPT]
    recs = [r for r in recs if "messages" in r or "prompt" in r]
    if not recs:
        raise ValueError(f"{p}: no records with 'messages' or 'prompt'")
    return [recs[i % len(recs)] for i in range(n)]


def request_body(rec: dict, cfg: BenchConfig) -> tuple[str, dict]:
    body = {"max_tokens": cfg.max_tokens, "temperature": cfg.temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    if cfg.model:
        body["model"] = cfg.model
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if "messages" in rec:
        return "/v1/chat/completions", {**body, "messages": rec["messages"]}
    return "/v1/completions", {**body, "prompt": rec["prompt"]}


def _content(chunk: dict) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    return (c.get("delta") or {}).get("content") or c.get("text") or ""


async def send_one(http: aiohttp.ClientSession, cfg: BenchConfig, rec: dict, t0: float) -> RequestResult:
    path, body = request_body(rec, cfg)
    res = RequestResult(ok=False)
    start = time.perf_counter()
    res.start = start - t0
    last = None
    try:
        async with http.post(cfg.base_url.rstrip("/") + path, json=body) as resp:
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return res
            async for raw in resp.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = str(chunk["error"])[:200]
                    return res
                now = time.perf_counter()
                if _content(chunk):
                    if last is None:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
                    res.chunks += 1
                usage = chunk.get("usage")
                if usage:
                    res.prompt_tokens = usage.get("prompt_tokens", 0)
                    res.output_tokens = usage.get("completion_tokens", 0)
                    res.spec = usage.get("spec_decoding")
        res.e2e = time.perf_counter() - start
        if not res.output_tokens:  # server without include_usage: one token per chunk
            res.output_tokens = res.chunks
        res.ok = res.chunks > 0
        if not res.ok:
            res.error = "no content streamed"
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


async def fetch_metrics(http: aiohttp.ClientSession, base_url: str) -> dict[str, float] | None:
    try:
        async with http.get(base_url.rstrip("/") + "/metrics") as resp:
            return prom_text.parse_totals(await resp.text()) if resp.status == 200 else None
    except aiohttp.ClientError:
        return None


def arrival_gaps(n: int, rate: float, seed: int) -> list[float]:
    """Poisson process: exponential gaps with mean 1/rate; all zero for rate = inf."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    return [rng.expovariate(rate) for _ in range(n)]


async def run_benchmark(cfg: BenchConfig, prompts: list[dict], warmup: list[dict] = ()) -> dict:
    """Send `warmup` prompts one by one (graph capture, allocator warm-up: not measured), then
    measure `prompts`."""
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers, connector=conn) as http:
        for rec in warmup:
            w = await send_one(http, cfg, rec, time.perf_counter())
            if not w.ok:
                raise RuntimeError(f"warm-up request failed: {w.error}")
        before = await fetch_metrics(http, cfg.base_url)
        sem = asyncio.Semaphore(cfg.max_concurrency)
        t0 = time.perf_counter()

        async def limited(rec):
            async with sem:
                return await send_one(http, cfg, rec, t0)

        tasks = []
        for rec, gap in zip(prompts, arrival_gaps(len(prompts), cfg.request_rate, cfg.seed)):
            if gap:
                await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(limited(rec)))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
        after = await fetch_metrics(http, cfg.base_url)
    return summarize(cfg, results, duration, before, after)


def summarize(cfg: BenchConfig, results: list[RequestResult], duration: float,
              before: dict | None, after: dict | None) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    spec = [r.spec for r in ok if r.spec and r.spec.get("verify_steps")]
    accept_resp = (sum(r.output_tokens for r in ok if r.spec and r.spec.get("verify_steps"))
                   / sum(s["verify_steps"] for s in spec)) if spec else None
    d = prom_text.deltas(before, after) if before is not None and after is not None else None
    decode_rates = [(r.output_tokens - 1) / (r.e2e - r.ttft) for r in ok if r.output_tokens > 1 and r.e2e > r.ttft]
    summary = {
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (out_tokens + sum(r.prompt_tokens for r in ok)) / duration,
        "total_output_tokens": out_tokens, "total_prompt_tokens": sum(r.prompt_tokens for r in ok),
        "ttft_ms": sample_stats([r.ttft for r in ok], 1000.0),
        "tpot_ms": sample_stats([r.tpot for r in ok if r.tpot is not None], 1000.0),
        "itl_ms": sample_stats([g for r in ok for g in r.itl], 1000.0),
        "e2e_ms": sample_stats([r.e2e for r in ok], 1000.0),
        "decode_tok_s": sample_stats(decode_rates),   # per request, after the first token
        "accept_length_responses": accept_resp,
        "accept_length_per_request": sample_stats([s["accept_length"] for s in spec if "accept_length" in s]),
        "accept_length_metrics": prom_text.accept_length_from_deltas(d) if d else None,
        "metrics_deltas": {k: v for k, v in (d or {}).items() if k.startswith("specserve_") and v} or None,
        "errors": sorted({r.error for r in results if not r.ok})[:10],
    }
    config = asdict(cfg) | {"api_key": None, "request_rate": str(cfg.request_rate) if math.isinf(cfg.request_rate)
                            else cfg.request_rate}
    return {"config": config, "summary": summary, "requests": [asdict(r) for r in results]}


def sample_stats(samples: list[float], scale: float = 1.0) -> dict | None:
    """Summary of samples as vLLM's benchmark_serving prints it (scale 1000: seconds to ms); None
    for no samples."""
    if not samples:
        return None
    a = np.asarray(samples, dtype=float) * scale
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "min": float(a.min()), "max": float(a.max()), "count": int(a.size)}


# -- output ---------------------------------------------------------------------------------
LATENCIES = [("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E latency")]


def markdown(result: dict) -> str:
    s, c = result["summary"], result["config"]
    head = (f"# Serving benchmark\n\n`{result['provenance']['command']}`\n\n"
            f"{c['base_url']}, max concurrency {c['max_concurrency']}, request rate {c['request_rate']}, "
            f"{c['num_prompts']} prompts, max_tokens {c['max_tokens']}, temperature {c['temperature']}\n\n")

    def acc(v):
        return f"{v:.3f}" if v is not None else "-"

    totals = md_table(["completed", "failed", "duration s", "req/s", "output tok/s", "total tok/s",
                       "accept length (responses)", "accept length (/metrics)"],
                      [[s["completed"], s["failed"], s["duration_s"], s["request_throughput"],
                        s["output_throughput"], s["total_token_throughput"], acc(s["accept_length_responses"]),
                        acc(s["accept_length_metrics"])]])
    rows = []
    for key, name in LATENCIES + [("decode_tok_s", "decode tok/s per request")]:
        v = s[key]
        unit = "" if key == "decode_tok_s" else " (ms)"
        rows.append([name + unit] + ([v["mean"], v["median"], v["p99"]] if v else [None] * 3))
    note = ("\nAccept length (responses) = Σ completion tokens / Σ verify steps (first token included, the "
            "SGLang convention); (/metrics) = 1 + Δaccepted / Δverify steps (the window formula). They differ by "
            "about 1 / verify steps per request.\n")
    return head + totals + "\n" + md_table(["metric", "mean", "p50", "p99"], rows) + note


def plot(result: dict, path: Path) -> Path:
    plt = pyplot()
    reqs = [r for r in result["requests"] if r["ok"]]
    series = {"TTFT": [r["ttft"] * 1e3 for r in reqs],
              "TPOT": [(r["e2e"] - r["ttft"]) / (r["output_tokens"] - 1) * 1e3 for r in reqs if r["output_tokens"] > 1],
              "ITL": [g * 1e3 for r in reqs for g in r["itl"]],
              "E2E": [r["e2e"] * 1e3 for r in reqs]}
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for ax, (name, vals) in zip(axes, series.items()):
        if vals:
            v = sorted(vals)
            ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], drawstyle="steps-post")
        ax.set_title(f"{name} CDF")
        ax.set_xlabel("ms")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of samples")
    c = result["config"]
    fig.suptitle(f"concurrency {c['max_concurrency']}, rate {c['request_rate']}, {c['num_prompts']} prompts")
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", help="model name sent in requests (default: the server's)")
    ap.add_argument("--api-key")
    ap.add_argument("--max-concurrency", type=int, default=1)
    ap.add_argument("--request-rate", type=float, default=math.inf, help="requests/s, Poisson; inf = all at once")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--prompts", help="JSONL of {messages} or {prompt} (default: shipped/data/heldout_prompts.jsonl)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--ignore-eos", action="store_true", help="always generate max_tokens")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured requests first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request seconds")
    ap.add_argument("--out-dir", default="runs/serving")
    ap.add_argument("--name", help="output file stem (default serving-c<concurrency>-r<rate>)")
    ap.add_argument("--claim", help="the sentence the result backs, for <out-dir>/manifest.json "
                    "(default: what was measured)")
    args = ap.parse_args(argv)
    cfg = BenchConfig(base_url=args.base_url, model=args.model, max_concurrency=args.max_concurrency,
                      request_rate=args.request_rate, num_prompts=args.num_prompts, max_tokens=args.max_tokens,
                      temperature=args.temperature, ignore_eos=args.ignore_eos, seed=args.seed,
                      timeout_s=args.timeout, api_key=args.api_key)
    prompts = load_prompts(args.prompts, args.num_prompts + args.warmup)
    result = asyncio.run(run_benchmark(cfg, prompts[args.warmup:], warmup=prompts[:args.warmup]))
    result["provenance"] = provenance(argv)
    name = args.name or f"serving-c{args.max_concurrency}-r{args.request_rate:g}"
    write_result(Path(args.out_dir) / f"{name}.json", result, markdown(result), plot)
    write_manifest(args.out_dir, args.claim or f"Output throughput and latency over HTTP of {args.base_url} at "
                   f"{args.max_concurrency} concurrent requests, {args.num_prompts} prompts, {args.max_tokens} tokens",
                   command=result["provenance"]["command"])
    return result


if __name__ == "__main__":
    main()
