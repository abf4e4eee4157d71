"""Load on any OpenAI-compatible server (ours, SGLang, vLLM): latency, throughput and accept length;
with --check, whether anything is lost or leaked under that load.

Streams chat (prompt records with `messages`) or text completions (`prompt`) with Poisson arrivals
(--request-rate, inf = all at once) under a concurrency cap, and reports vLLM benchmark_serving's
metrics:
  TTFT  = first streamed content chunk - request start
  TPOT  = (e2e - TTFT) / (output_tokens - 1)            per request
  ITL   = gaps between successive streamed content chunks (a chunk may carry several tokens
          when a draft run is accepted, so ITL > TPOT with speculation)
  E2E   = last byte - request start
Throughput = completed requests (output tokens) / wall time of the measured run. Accept length
twice: from the responses' usage.spec_decoding (sum of completion tokens / sum of verify steps)
and from /metrics counter deltas around the run (1 + delta accepted / delta verify steps).

--check ROUNDS sends every distinct greedy request alone first, one after another, then all of
them ROUNDS times at --max-concurrency, and checks each round: zero errors; every greedy output
read to its end (text, token count, finish reason) equal to the same request alone (batching,
speculation and sampled neighbours must not change a greedy result); every sampled output
(--sampled F: random temperature, top_p, top_k, seed) finished with a token; clients that hang up
after a few chunks (--drop F) leave nothing behind: the running and waiting gauges are back at 0
after the round; the resident memory of the server and its children (--pid, or the server this
starts) stays flat from the second round on (< 5 %). The exit status is 1 when a check fails.

Without --base-url it starts the server itself (`launch/serve.sh --profile P`, or `python -m
server --model M --draft D`) and stops it at the end.

  python -m benchmarks serve --base-url http://127.0.0.1:8000 --max-concurrency 8 --num-prompts 64
  python -m benchmarks serve --profile cpu-default --check 4 --max-concurrency 32 --num-prompts 200 \\
      --max-tokens 16,32 --sampled 0.33 --drop 0.1
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

from benchmarks.manifest import write_manifest
from benchmarks.report import md_table, provenance, write_result
from benchmarks.server_proc import free_port, wait_healthy
from drafter.prompts import read_records

PROJECT_ROOT = Path(__file__).resolve().parent.parent
HELDOUT = PROJECT_ROOT / "shipped" / "data" / "heldout_prompts.jsonl"

# Counters read from /metrics (Prometheus text) before and after a run.
VERIFY_STEPS = "specserve_spec_verify_steps_total"
ACCEPTED = "specserve_spec_accepted_tokens_total"
GENERATION = "specserve_generation_tokens_total"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(\s+\d+)?$")


def parse_totals(text: str) -> dict[str, float]:
    """Sample name -> value summed over label sets (a counter's total across labels)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m is None or line.startswith("#"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if not math.isnan(value):
            totals[m.group(1)] = totals.get(m.group(1), 0.0) + value
    return totals


def deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def accept_length_from_deltas(d: dict[str, float]) -> float | None:
    """1 + accepted draft tokens / verify steps; None when no verify step happened."""
    steps = d.get(VERIFY_STEPS, 0.0)
    return 1.0 + d[ACCEPTED] / steps if steps > 0 and ACCEPTED in d else None


def metrics(url: str) -> dict[str, float] | None:
    try:
        r = httpx.get(url + "/metrics", timeout=10)
    except httpx.HTTPError:
        return None
    return parse_totals(r.text) if r.status_code == 200 else None


@dataclass
class Reply:
    start: float = 0.0                 # seconds since the run began
    ttft: float = 0.0                  # seconds
    e2e: float = 0.0                   # seconds
    itl: list[float] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    chunks: int = 0                    # chunks with content
    finish_reason: str | None = None
    spec: dict | None = None           # usage.spec_decoding of the response
    error: str | None = None
    dropped: bool = False              # the client hung up on purpose (item["drop_after"])

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None

    def same_output(self, other: Reply) -> bool:
        return (self.text, self.output_tokens, self.finish_reason) == \
            (other.text, other.output_tokens, other.finish_reason)


def requests(records: list[dict], max_tokens: list[int], n: int, *, temperature: float = 0.0,
             ignore_eos: bool = False, model: str | None = None, shuffle: bool = False) -> list[dict]:
    """n streaming requests cycling over every (record, max_tokens) pair; shuffled, equal requests
    rarely run side by side."""
    items = []
    for m in max_tokens:
        for rec in records:
            body = {"max_tokens": m, "temperature": temperature, "stream": True,
                    "stream_options": {"include_usage": True}, **({"model": model} if model else {}),
                    **({"ignore_eos": True} if ignore_eos else {})}
            chat = "messages" in rec
            items.append({"path": "/v1/chat/completions" if chat else "/v1/completions",
                          "body": {**body, **({"messages": rec["messages"]} if chat else {"prompt": rec["prompt"]})}})
    items = [items[i % len(items)] for i in range(n)]
    if shuffle:
        random.Random(0).shuffle(items)
    return items


def vary(items: list[dict], sampled: float, drop: float, seed: int = 0) -> list[dict]:
    """Copies of `items` where a `sampled` fraction gets random sampling parameters (marked
    "sampled") and a `drop` fraction of clients hangs up after 1-3 content chunks ("drop_after")."""
    rng = random.Random(seed)
    out = []
    for item in items:
        item = {**item, "body": dict(item["body"])}
        if rng.random() < sampled:
            item["sampled"] = True
            item["body"].update(temperature=round(rng.uniform(0.3, 1.3), 2), top_p=round(rng.uniform(0.5, 1.0), 2),
                                top_k=rng.choice([-1, 5, 50]))
            if rng.random() < 0.5:
                item["body"]["seed"] = rng.randrange(1 << 31)
        if rng.random() < drop:
            item["drop_after"] = rng.randint(1, 3)
        out.append(item)
    return out


def key(item: dict) -> str:
    """The request itself (endpoint and body), whatever its client does with the stream."""
    return json.dumps({"path": item["path"], "body": item["body"]}, sort_keys=True)


async def stream(client: httpx.AsyncClient, url: str, item: dict, t0: float) -> Reply:
    res, start, last, text = Reply(), time.perf_counter(), None, []
    res.start = start - t0
    try:
        async with client.stream("POST", url + item["path"], json=item["body"]) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:300]}"
                return res
            async for line in r.aiter_lines():
                data = line[5:].strip() if line.startswith("data:") else None
                if data == "[DONE]":
                    break
                chunk = json.loads(data) if data else {}
                if "error" in chunk:
                    res.error = json.dumps(chunk["error"])[:300]
                    break
                now = time.perf_counter()
                for c in chunk.get("choices") or []:
                    res.finish_reason = c.get("finish_reason") or res.finish_reason
                    if piece := (c.get("delta") or {}).get("content") or c.get("text") or "":
                        text.append(piece)
                        if last is None:
                            res.ttft = now - start
                        else:
                            res.itl.append(now - last)
                        last, res.chunks = now, res.chunks + 1
                if usage := chunk.get("usage"):
                    res.prompt_tokens, res.spec = usage.get("prompt_tokens", 0), usage.get("spec_decoding")
                    res.output_tokens = usage.get("completion_tokens", 0)
                if res.chunks and res.chunks == item.get("drop_after"):  # leaving `async with` hangs up
                    res.dropped = True
                    break
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
    res.e2e, res.text = time.perf_counter() - start, "".join(text)
    res.output_tokens = res.output_tokens or res.chunks  # a server without include_usage: a token per chunk
    if res.error is None and not res.output_tokens and not res.dropped:
        res.error = "no content streamed"
    return res


def arrival_gaps(n: int, rate: float, seed: int) -> list[float]:
    """Poisson process: exponential gaps with mean 1/rate; all zero for rate = inf."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    return [rng.expovariate(rate) for _ in range(n)]


def load(url: str, items: list[dict], concurrency: int, rate: float = math.inf, seed: int = 0,
         timeout_s: float = 600.0, api_key: str | None = None) -> tuple[list[Reply], float]:
    """Send `items` (arrivals at `rate`) with at most `concurrency` in flight: the replies in
    order, and the seconds the whole took."""
    async def run():
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        async with httpx.AsyncClient(timeout=timeout_s, headers=headers, limits=httpx.Limits(
                max_connections=concurrency, max_keepalive_connections=concurrency)) as client:
            gate, t0, tasks = asyncio.Semaphore(concurrency), time.perf_counter(), []

            async def one(item):
                async with gate:
                    return await stream(client, url, item, t0)
            for item, gap in zip(items, arrival_gaps(len(items), rate, seed)):
                await asyncio.sleep(gap)
                tasks.append(asyncio.create_task(one(item)))
            return await asyncio.gather(*tasks), time.perf_counter() - t0
    replies, seconds = asyncio.run(run())
    return list(replies), seconds


def sample_stats(samples: list[float], scale: float = 1.0) -> dict | None:
    """Summary of samples as vLLM's benchmark_serving prints it (scale 1000: seconds to ms)."""
    if not samples:
        return None
    a = np.asarray(samples, dtype=float) * scale
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "min": float(a.min()), "max": float(a.max()), "count": int(a.size)}


def summarize(replies: list[Reply], duration: float, before: dict | None, after: dict | None) -> dict:
    ok = [r for r in replies if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    spec = [r for r in ok if r.spec and r.spec.get("verify_steps")]
    d = deltas(before, after) if before is not None and after is not None else None
    return {
        "completed": len(ok), "failed": len(replies) - len(ok), "duration_s": duration,
        "request_throughput": len(ok) / duration, "output_throughput": out_tokens / duration,
        "total_token_throughput": (out_tokens + sum(r.prompt_tokens for r in ok)) / duration,
        "total_output_tokens": out_tokens, "total_prompt_tokens": sum(r.prompt_tokens for r in ok),
        "ttft_ms": sample_stats([r.ttft for r in ok], 1000.0),
        "tpot_ms": sample_stats([r.tpot for r in ok if r.tpot is not None], 1000.0),
        "itl_ms": sample_stats([g for r in ok for g in r.itl], 1000.0),
        "e2e_ms": sample_stats([r.e2e for r in ok], 1000.0),
        "decode_tok_s": sample_stats([(r.output_tokens - 1) / (r.e2e - r.ttft) for r in ok   # per request
                                      if r.output_tokens > 1 and r.e2e > r.ttft]),
        "accept_length_responses": sum(r.output_tokens for r in spec) / sum(r.spec["verify_steps"] for r in spec)
        if spec else None,
        "accept_length_per_request": sample_stats([r.spec["accept_length"] for r in spec if "accept_length" in r.spec]),
        "accept_length_metrics": accept_length_from_deltas(d) if d else None,
        "metrics_deltas": {k: v for k, v in (d or {}).items() if k.startswith("specserve_") and v} or None,
        "errors": sorted({r.error for r in replies if not r.ok})[:10]}


def measure(url: str, items: list[dict], warmup: list[dict], concurrency: int, rate: float, seed: int,
            timeout_s: float, api_key: str | None) -> dict:
    """The `warmup` requests one by one (graph capture, allocator warm-up: not measured), then `items`."""
    for item in warmup:
        (w,), _ = load(url, [item], 1, timeout_s=timeout_s, api_key=api_key)
        if not w.ok:
            raise RuntimeError(f"warm-up request failed: {w.error}")
    before = metrics(url)
    replies, duration = load(url, items, concurrency, rate, seed, timeout_s, api_key)
    return {"summary": summarize(replies, duration, before, metrics(url)), "requests": [asdict(r) for r in replies]}


def gauges(url: str) -> tuple[float, float]:
    """(running, waiting) from /metrics."""
    values = metrics(url) or {}
    return values.get("specserve_num_requests_running", -1), values.get("specserve_num_requests_waiting", -1)


def wait_idle(url: str, timeout_s: float = 10) -> tuple[float, float]:
    """Poll until running and waiting are 0 (a stream's slot is released right after its final
    chunk was sent); return the last reading."""
    deadline = time.monotonic() + timeout_s
    while (load_now := gauges(url)) != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.02)
    return load_now


def rss_mb(pid: int | None) -> float | None:
    """Resident memory of the server and every process under it (the engine runs in a child)."""
    if not pid:
        return None
    import psutil
    root = psutil.Process(pid)
    return round(sum(p.memory_info().rss for p in [root, *root.children(recursive=True)] if p.is_running()) / 2**20, 1)


def check(url: str, pid: int | None, items: list[dict], concurrency: int, rounds: int) -> dict:
    """Every distinct greedy request alone, then `rounds` concurrent rounds of `items`."""
    distinct = list({key(i): {"path": i["path"], "body": i["body"]} for i in items if not i.get("sampled")}.values())
    t0 = time.perf_counter()
    alone = {key(i): load(url, [i], 1)[0][0] for i in distinct}
    out = {"requests": len(items), "distinct": len(distinct), "concurrency": concurrency,
           "alone_s": round(time.perf_counter() - t0, 2), "alone_errors": sum(not r.ok for r in alone.values()),
           "rss_mb_before": rss_mb(pid), "rounds": []}
    for n in range(1, rounds + 1):
        replies, wall = load(url, items, concurrency)
        errors = [r for r in replies if not r.ok]
        greedy = [(i, r) for i, r in zip(items, replies) if r.ok and not r.dropped and not i.get("sampled")]
        mismatches = [(i, r) for i, r in greedy if not r.same_output(alone[key(i)])]
        sampled = [(i, r) for i, r in zip(items, replies) if r.ok and i.get("sampled")]
        bad = [(i, r) for i, r in sampled if not r.dropped and r.finish_reason not in ("stop", "length")]
        idle = wait_idle(url)
        tokens = sum(r.output_tokens for r in replies if r.ok)
        out["rounds"].append({
            "round": n, "wall_s": round(wall, 2), "tokens": tokens, "tok_s": round(tokens / wall, 1),
            "errors": len(errors), "greedy_compared": len(greedy), "mismatches": len(mismatches),
            "sampled": len(sampled), "sampled_bad": len(bad), "dropped": sum(r.dropped for r in replies),
            "idle_running": idle[0], "idle_waiting": idle[1], "rss_mb": rss_mb(pid),
            "first_error": asdict(errors[0]) if errors else None,
            "first_mismatch": {"request": mismatches[0][0], "got": asdict(mismatches[0][1]),
                               "alone": asdict(alone[key(mismatches[0][0])])} if mismatches else None,
            "first_bad_sample": {"request": bad[0][0], "got": asdict(bad[0][1])} if bad else None})
    rss = [r["rss_mb"] for r in out["rounds"]]
    if pid and len(rss) >= 2:
        base = rss[1] if len(rss) >= 3 else rss[0]  # the first round warms allocator pools up
        out["rss_growth_after_warmup"] = round((rss[-1] - base) / base, 4)
    out["passed"] = passed(out)
    return out


def passed(result: dict, max_growth: float = 0.05) -> bool:
    return result["alone_errors"] == 0 and all(
        r["errors"] == 0 and r["mismatches"] == 0 and r["sampled_bad"] == 0
        and (r["idle_running"], r["idle_waiting"]) == (0, 0) for r in result["rounds"]) \
        and result.get("rss_growth_after_warmup", 0.0) < max_growth


def markdown(result: dict) -> str:
    c = result["config"]
    head = (f"# {'Load check' if 'rounds' in result else 'Serving benchmark'}\n\n"
            f"`{result['provenance']['command']}`\n\n{result.get('server') or c['base_url']}, max concurrency "
            f"{c['max_concurrency']}, request rate {c['request_rate']}, {c['num_prompts']} prompts, "
            f"max_tokens {c['max_tokens']}\n\n")
    if "rounds" in result:
        rows = [[r["round"], r["wall_s"], r["tokens"], r["tok_s"], r["errors"], r["greedy_compared"], r["mismatches"],
                 f"{r['sampled']} ({r['sampled_bad']})", r["dropped"], f"{r['idle_running']:.0f}, "
                 f"{r['idle_waiting']:.0f}", r["rss_mb"]] for r in result["rounds"]]
        growth = result.get("rss_growth_after_warmup")
        return head + (f"Alone: {result['distinct']} distinct requests in {result['alone_s']} s, "
                       f"{result['alone_errors']} errors; RSS before the rounds {result['rss_mb_before']} MiB.\n\n") \
            + md_table(["round", "wall s", "tokens", "tok/s", "errors", "greedy compared", "outputs != alone",
                        "sampled (bad)", "dropped", "running, waiting after", "RSS MiB"], rows) \
            + (f"\nRSS growth from round 2 to the last round: {100 * growth:.2f} %\n" if growth is not None else "") \
            + (f"\nVerdict: {'PASS' if result['passed'] else 'FAIL'} (zero errors, every greedy output read to its "
               "end equal to the request alone, every sampled one finished with tokens, gauges back at 0 after "
               "every round, RSS growth after warm-up < 5 %)\n")
    s = result["summary"]
    acc = [f"{v:.3f}" if v is not None else "-" for v in (s["accept_length_responses"], s["accept_length_metrics"])]
    rows = [[name] + ([v["mean"], v["median"], v["p99"]] if (v := s[k]) else [None] * 3) for k, name in (
        ("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("itl_ms", "ITL (ms)"), ("e2e_ms", "E2E latency (ms)"),
        ("decode_tok_s", "decode tok/s per request"))]
    return head + md_table(["completed", "failed", "duration s", "req/s", "output tok/s", "total tok/s",
                            "accept length (responses)", "accept length (/metrics)"],
                           [[s["completed"], s["failed"], s["duration_s"], s["request_throughput"],
                             s["output_throughput"], s["total_token_throughput"], *acc]]) + "\n" \
        + md_table(["metric", "mean", "p50", "p99"], rows) \
        + ("\nAccept length (responses) = completion tokens / verify steps (first token included, the SGLang "
           "convention); (/metrics) = 1 + accepted / verify steps (the window formula). They differ by about "
           "1 / verify steps per request.\n")


def start_server(port: int, log_path: Path, model: str | None = None, draft: str | None = None,
                 profile: str | None = None, steps: int | None = None, max_batch: int = 16,
                 threads: int | None = None) -> subprocess.Popen:
    """`launch/serve.sh --profile P` or `python -m server --model M [--draft D]` on CPU (serve.sh
    execs Python: the pid is the server's either way); `steps`: --steps for either."""
    cmd = [str(PROJECT_ROOT / "launch" / "serve.sh"), "--profile", profile] if profile else \
        [sys.executable, "-m", "server", "--model", model, "--max-batch", str(max_batch), "--device", "cpu",
         "--log-level", "warning", *(["--draft", draft] if draft else [])]
    cmd += ["--port", str(port), *(["--steps", str(steps)] if steps else [])]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
           **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(PROJECT_ROOT))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", help="a running server (default: start one, see --profile and --model)")
    ap.add_argument("--profile", help="start launch/serve.sh --profile PROFILE")
    ap.add_argument("--model", help="start python -m server --model MODEL on CPU (with --draft)")
    ap.add_argument("--draft")
    ap.add_argument("--steps", type=int, help="--steps for the server it starts")
    ap.add_argument("--max-batch", type=int, default=16, help="for the server --model starts")
    ap.add_argument("--threads", type=int, help="OMP_NUM_THREADS for the server it starts")
    ap.add_argument("--pid", type=int, help="with --base-url: the server's pid, for --check's RSS")
    ap.add_argument("--served-model", help="model name sent in requests (default: the server's)")
    ap.add_argument("--api-key")
    ap.add_argument("--max-concurrency", type=int, default=1)
    ap.add_argument("--request-rate", type=float, default=math.inf, help="requests/s, Poisson; inf = all at once")
    ap.add_argument("--num-prompts", type=int, default=32, help="requests per run (per round with --check)")
    ap.add_argument("--prompts", default=str(HELDOUT), help="JSONL of {messages} or {prompt}")
    ap.add_argument("--max-tokens", default="256", help="max_tokens, or a comma list to mix")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--ignore-eos", action="store_true", help="always generate max_tokens")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured requests first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request seconds")
    ap.add_argument("--check", type=int, default=0, metavar="ROUNDS", help="check ROUNDS rounds (see above)")
    ap.add_argument("--sampled", type=float, default=0.0, help="with --check: the share with random sampling")
    ap.add_argument("--drop", type=float, default=0.0, help="with --check: the share of clients that hang up")
    ap.add_argument("--out-dir", default="runs/serving")
    ap.add_argument("--name", help="output file stem (default serving-c<concurrency>-r<rate>, check-c<concurrency>)")
    ap.add_argument("--claim", help="the sentence the result backs, for <out-dir>/manifest.json")
    args = ap.parse_args(argv)
    if not (args.base_url or args.profile or args.model):
        ap.error("give --base-url, or --profile or --model for a server to start")
    prov = provenance(argv)
    name = args.name or (f"check-c{args.max_concurrency}" if args.check else
                         f"serving-c{args.max_concurrency}-r{args.request_rate:g}")
    proc, url, pid = None, args.base_url, args.pid
    if url is None:
        port = free_port()
        log = Path(args.out_dir) / f"{name}.server.log"
        proc = start_server(port, log, args.model, args.draft, args.profile, args.steps, args.max_batch, args.threads)
        url, pid = f"http://127.0.0.1:{port}", proc.pid
    records = [r for r in read_records(args.prompts) if "messages" in r or "prompt" in r]
    max_tokens = [int(m) for m in args.max_tokens.split(",")]
    try:
        wait_healthy(url, proc, output=(lambda: log.read_text(errors="replace")) if proc else None)
        if args.check:
            items = vary(requests(records, max_tokens, args.num_prompts, model=args.served_model, shuffle=True),
                         args.sampled, args.drop, args.seed)
            result = check(url, pid, items, args.max_concurrency, args.check)
        else:
            items = requests(records, max_tokens, args.num_prompts + args.warmup, temperature=args.temperature,
                             ignore_eos=args.ignore_eos, model=args.served_model)
            result = measure(url, items[args.warmup:], items[:args.warmup], args.max_concurrency, args.request_rate,
                             args.seed, args.timeout, args.api_key)
    finally:
        if proc is not None:
            proc.terminate()  # our own child, by pid
            proc.wait(60)
    result = {"config": {k: str(v) if isinstance(v, float) and math.isinf(v) else v for k, v in vars(args).items()
                         if k != "api_key"} | {"base_url": url}, **result, "provenance": prov,
              "server": f"started: {args.profile or args.model}, {os.cpu_count()} CPU cores" if proc else None}
    write_result(Path(args.out_dir) / f"{name}.json", result, markdown(result))
    write_manifest(args.out_dir, args.claim or (f"No errors, losses or leaks under load at {args.max_concurrency} "
                   "concurrent requests" if args.check else f"Output throughput and latency over HTTP of {url} at "
                   f"{args.max_concurrency} concurrent requests, {args.num_prompts} prompts, {args.max_tokens} tokens"),
                   command=prov["command"])
    return result


if __name__ == "__main__":
    raise SystemExit(main().get("passed") is False)
