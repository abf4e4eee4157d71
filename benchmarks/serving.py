"""Load on any OpenAI-compatible server (ours, SGLang, vLLM): latency, throughput and accept length; with
--check, whether anything is lost or leaked under that load.

Streams greedy chat (records with `messages`) or completions (`prompt`) under a concurrency cap and reports
vLLM benchmark_serving's metrics: TTFT (first content chunk - start), TPOT ((e2e - TTFT) / (tokens - 1)), ITL
(gaps between content chunks: a chunk may carry an accepted draft run, so ITL > TPOT with speculation), E2E;
throughput over the run's wall time. Accept length from the responses' usage.spec_decoding (completion
tokens / verify steps) and from /metrics deltas (1 + accepted / verify steps).

--check ROUNDS sends every distinct greedy request alone, then all of them ROUNDS times at
--max-concurrency, and checks each round: no errors; every greedy output read to its end equal to the same
request alone (text, tokens, finish reason); every sampled one (--sampled F: random temperature, top_p,
top_k, seed) finished with a token; clients hanging up after a few chunks (--drop F) leave the running and
waiting gauges at 0; the resident memory of the server and its children stays flat from round 2 on (< 5%).
Exit status 1 when a check fails.

Without --base-url it starts our server, `launch/serve.sh LAUNCH` (--launch "ARGS"), and stops it after.

  python -m benchmarks serve --base-url http://127.0.0.1:8000 --max-concurrency 8 --num-prompts 64
  python -m benchmarks serve --launch "--profile cpu-default" --check 4 --max-concurrency 32 --num-prompts 200 \\
      --max-tokens 16,32 --sampled 0.33 --drop 0.1
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import random
import shlex
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.report import md_table, provenance, write_result
from benchmarks.server_proc import ROOT, free_port, ours, ours_env, server_process
from drafter.prompts import read_records

HELDOUT = ROOT / "shipped" / "data" / "heldout_prompts.jsonl"
VERIFY_STEPS = "specserve_spec_verify_steps_total"   # counters read from /metrics around a run
ACCEPTED = "specserve_spec_accepted_tokens_total"
GENERATION = "specserve_generation_tokens_total"


def parse_totals(text: str) -> dict[str, float]:
    """Prometheus text: sample name -> value summed over its label sets."""
    totals: dict[str, float] = {}
    for s in (s for family in text_string_to_metric_families(text) for s in family.samples):
        if not math.isnan(s.value):
            totals[s.name] = totals.get(s.name, 0.0) + s.value
    return totals


def deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def accept_length_from_deltas(d: dict[str, float]) -> float | None:
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
    start: float = 0.0                 # seconds from the run's start (its t0)
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    chunks: int = 0                    # chunks with content
    finish_reason: str | None = None
    spec: dict | None = None           # usage.spec_decoding
    error: str | None = None
    dropped: bool = False              # the client hung up on purpose (item["drop_after"])

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None

    def arrivals(self) -> list[float]:
        """Each content chunk's arrival, seconds from the run's start."""
        return list(itertools.accumulate(self.itl, initial=self.start + self.ttft)) if self.chunks else []

    def same_output(self, other: Reply) -> bool:
        return (self.text, self.output_tokens, self.finish_reason) == \
            (other.text, other.output_tokens, other.finish_reason)


def requests(records: list[dict], max_tokens: list[int], n: int, *, model: str | None = None,
             shuffle: bool = False) -> list[dict]:
    """n streaming requests cycling over every (record, max_tokens) pair; shuffled, equal requests rarely
    run side by side."""
    items = []
    for m in max_tokens:
        for rec in records:
            chat = "messages" in rec
            items.append({"path": "/v1/chat/completions" if chat else "/v1/completions", "body": {
                "max_tokens": m, "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
                **({"model": model} if model else {}),
                **({"messages": rec["messages"]} if chat else {"prompt": rec["prompt"]})}})
    items = [items[i % len(items)] for i in range(n)]
    if shuffle:
        random.Random(0).shuffle(items)
    return items


def vary(items: list[dict], sampled: float, drop: float, seed: int = 0) -> list[dict]:
    """Copies of `items`: a `sampled` share gets random sampling parameters (marked "sampled"), a `drop` share
    of clients hangs up after 1-3 content chunks ("drop_after")."""
    rng, out = random.Random(seed), []
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
    """One streamed request; t0: the run's start (time.perf_counter())."""
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


def load(url: str, items: list[dict], concurrency: int, timeout_s: float = 600.0) -> tuple[list[Reply], float]:
    """Send `items`, at most `concurrency` in flight: the replies in order, and the seconds the whole took."""
    async def run():
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
            gate, t0 = asyncio.Semaphore(concurrency), time.perf_counter()

            async def one(item):
                async with gate:
                    return await stream(client, url, item, t0)
            return await asyncio.gather(*map(one, items)), time.perf_counter() - t0
    replies, seconds = asyncio.run(run())
    return list(replies), seconds


def sample_stats(samples: list[float], scale: float = 1.0) -> dict | None:
    """As vLLM's benchmark_serving prints them (scale 1000: seconds to ms)."""
    if not samples:
        return None
    a = np.asarray(samples, dtype=float) * scale
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "min": float(a.min()), "max": float(a.max()), "count": int(a.size)}


def summarize(replies: list[Reply], duration: float, before: dict | None, after: dict | None) -> dict:
    ok = [r for r in replies if r.ok]
    out_tokens, prompt_tokens = sum(r.output_tokens for r in ok), sum(r.prompt_tokens for r in ok)
    spec = [r for r in ok if r.spec and r.spec.get("verify_steps")]
    d = deltas(before, after) if before is not None and after is not None else {}
    return {
        "completed": len(ok), "failed": len(replies) - len(ok), "duration_s": duration,
        "request_throughput": len(ok) / duration, "output_throughput": out_tokens / duration,
        "total_token_throughput": (out_tokens + prompt_tokens) / duration,
        "total_output_tokens": out_tokens, "total_prompt_tokens": prompt_tokens,
        "ttft_ms": sample_stats([r.ttft for r in ok], 1000.0),
        "tpot_ms": sample_stats([r.tpot for r in ok if r.tpot is not None], 1000.0),
        "itl_ms": sample_stats([g for r in ok for g in r.itl], 1000.0),
        "e2e_ms": sample_stats([r.e2e for r in ok], 1000.0),
        "decode_tok_s": sample_stats([(r.output_tokens - 1) / (r.e2e - r.ttft) for r in ok   # per request
                                      if r.output_tokens > 1 and r.e2e > r.ttft]),
        "accept_length_responses": sum(r.output_tokens for r in spec) / sum(r.spec["verify_steps"] for r in spec)
        if spec else None,
        "accept_length_metrics": accept_length_from_deltas(d) if d else None,
        "metrics_deltas": {k: v for k, v in d.items() if k.startswith("specserve_") and v} or None,
        "errors": sorted({r.error for r in replies if not r.ok})[:10]}


def measure(url: str, items: list[dict], warmup: list[dict], concurrency: int, timeout_s: float) -> dict:
    """The `warmup` requests one by one (graph captures, allocator pools: not measured), then `items`."""
    for item in warmup:
        (w,), _ = load(url, [item], 1, timeout_s)
        if not w.ok:
            raise RuntimeError(f"warm-up request failed: {w.error}")
    before = metrics(url)
    replies, duration = load(url, items, concurrency, timeout_s)
    return {"summary": summarize(replies, duration, before, metrics(url)), "requests": [asdict(r) for r in replies]}


def drained(url: str, timeout_s: float = 10) -> tuple[float, float]:
    """The (running, waiting) gauges once both are 0 (a slot is released right after a stream's last chunk),
    or their last reading after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = metrics(url) or {}
        now = m.get("specserve_num_requests_running", -1), m.get("specserve_num_requests_waiting", -1)
        if now == (0, 0) or time.monotonic() > deadline:
            return now
        time.sleep(0.02)


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
        pairs = list(zip(items, replies))
        errors = [r for r in replies if not r.ok]
        greedy = [(i, r) for i, r in pairs if r.ok and not r.dropped and not i.get("sampled")]
        mismatches = [(i, r) for i, r in greedy if not r.same_output(alone[key(i)])]
        sampled = [(i, r) for i, r in pairs if r.ok and i.get("sampled")]
        bad = [(i, r) for i, r in sampled if not r.dropped and r.finish_reason not in ("stop", "length")]
        idle, tokens = drained(url), sum(r.output_tokens for r in replies if r.ok)
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
    out["passed"] = out["alone_errors"] == 0 and out.get("rss_growth_after_warmup", 0.0) < 0.05 and all(
        r["errors"] == r["mismatches"] == r["sampled_bad"] == 0 and (r["idle_running"], r["idle_waiting"]) == (0, 0)
        for r in out["rounds"])
    return out


def markdown(result: dict) -> str:
    c = result["config"]
    head = (f"# {'Load check' if 'rounds' in result else 'Serving benchmark'}\n\n`{result['provenance']['command']}`"
            f"\n\n{c['base_url']}, max concurrency {c['max_concurrency']}, {c['num_prompts']} prompts, "
            f"max_tokens {c['max_tokens']}\n\n")
    if "rounds" in result:
        rows = [[r["round"], r["wall_s"], r["tokens"], r["tok_s"], r["errors"], r["greedy_compared"], r["mismatches"],
                 f"{r['sampled']} ({r['sampled_bad']})", r["dropped"], f"{r['idle_running']:.0f}, "
                 f"{r['idle_waiting']:.0f}", r["rss_mb"]] for r in result["rounds"]]
        return head + (f"Alone: {result['distinct']} distinct requests in {result['alone_s']} s, "
                       f"{result['alone_errors']} errors; RSS before the rounds {result['rss_mb_before']} MiB.\n\n") \
            + md_table(["round", "wall s", "tokens", "tok/s", "errors", "greedy compared", "outputs != alone",
                        "sampled (bad)", "dropped", "running, waiting after", "RSS MiB"], rows) \
            + f"\nRSS growth from round 2 to the last: {result.get('rss_growth_after_warmup')}\n\n" \
            + f"Verdict: {'PASS' if result['passed'] else 'FAIL'}\n"
    s = result["summary"]
    rows = [[name] + ([v["mean"], v["median"], v["p99"]] if (v := s[k]) else [None] * 3) for k, name in (
        ("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("itl_ms", "ITL (ms)"), ("e2e_ms", "E2E latency (ms)"),
        ("decode_tok_s", "decode tok/s per request"))]
    return head + md_table(["completed", "failed", "duration s", "req/s", "output tok/s", "total tok/s",
                            "accept length (responses)", "accept length (/metrics)"],
                           [[s[k] for k in ("completed", "failed", "duration_s", "request_throughput",
                                            "output_throughput", "total_token_throughput", "accept_length_responses",
                                            "accept_length_metrics")]]) + "\n" \
        + md_table(["metric", "mean", "p50", "p99"], rows) \
        + ("\nAccept length (responses) = completion tokens / verify steps (the first token included, SGLang's "
           "convention); (/metrics) = 1 + accepted / verify steps. They differ by about 1 / verify steps.\n")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", help="a running server (default: start ours, see --launch)")
    ap.add_argument("--launch", help="start `launch/serve.sh LAUNCH` (e.g. \"--profile cpu-default\")")
    ap.add_argument("--pid", type=int, help="with --base-url: the server's pid, for --check's RSS")
    ap.add_argument("--served-model", help="model name sent in requests (default: the server's)")
    ap.add_argument("--max-concurrency", type=int, default=1)
    ap.add_argument("--num-prompts", type=int, default=32, help="requests per run (per round with --check)")
    ap.add_argument("--prompts", default=str(HELDOUT), help="JSONL of {messages} or {prompt}")
    ap.add_argument("--max-tokens", default="256", help="max_tokens, or a comma list to mix")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured requests first")
    ap.add_argument("--seed", type=int, default=0, help="of --check's sampled requests and hang-ups")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request seconds")
    ap.add_argument("--check", type=int, default=0, metavar="ROUNDS", help="check ROUNDS rounds (see above)")
    ap.add_argument("--sampled", type=float, default=0.0, help="with --check: the share with random sampling")
    ap.add_argument("--drop", type=float, default=0.0, help="with --check: the share of clients that hang up")
    ap.add_argument("--out-dir", default="runs/serving")
    ap.add_argument("--name", help="output file stem (default serving-c<concurrency>, check-c<concurrency>)")
    ap.add_argument("--claim", help="the sentence the result backs, for <out-dir>/manifest.json")
    args = ap.parse_args(argv)
    if not (args.base_url or args.launch):
        ap.error("give --base-url, or --launch for a server to start")
    prov = provenance(argv)
    name = args.name or f"{'check' if args.check else 'serving'}-c{args.max_concurrency}"
    records = [r for r in read_records(args.prompts) if "messages" in r or "prompt" in r]
    max_tokens = [int(m) for m in args.max_tokens.split(",")]
    with contextlib.ExitStack() as stack:
        url, pid = args.base_url, args.pid
        if url is None:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            pid = stack.enter_context(server_process(ours([*shlex.split(args.launch), "--port", str(port)]), Path(
                args.out_dir) / f"{name}.server.log", ours_env(), url, timeout_s=900)).pid
        if args.check:
            items = vary(requests(records, max_tokens, args.num_prompts, model=args.served_model, shuffle=True),
                         args.sampled, args.drop, args.seed)
            result = check(url, pid, items, args.max_concurrency, args.check)
        else:
            items = requests(records, max_tokens, args.num_prompts + args.warmup, model=args.served_model)
            result = measure(url, items[args.warmup:], items[:args.warmup], args.max_concurrency, args.timeout)
    result = {"config": vars(args) | {"base_url": url}, **result, "provenance": prov}
    write_result(Path(args.out_dir) / f"{name}.json", result, markdown(result), claim=args.claim or (
        f"No errors, losses or leaks under load at {args.max_concurrency} concurrent requests" if args.check else
        f"Output throughput and latency over HTTP of {url} at {args.max_concurrency} concurrent requests, "
        f"{args.num_prompts} prompts, {args.max_tokens} tokens"))
    return result


if __name__ == "__main__":
    raise SystemExit(main().get("passed") is False)
