"""Load and leak check against a live server: N streaming requests at concurrency
C, repeated for R rounds. Greedy by default; --sampled F gives a fraction of them random
sampling parameters (temperature, top_p, top_k, seed) and --drop F makes a fraction of the
clients hang up after their first few streamed chunks.

Checked per round: zero errors; every greedy output (text, token count, finish reason) that
was read to its end identical to the same request sent alone first (lossless under load:
batching, speculation and sampled neighbours must not change a greedy result); every sampled
output finished with at least one token; the running/waiting gauges back at 0 once the round
is over (no leaked KV-cache slot or queue entry, dropped clients included); the resident
memory (psutil RSS) of the server and its child processes, the engine among them, after each
round, which must stay flat from the second round on (no memory leak).

  python -m benchmarks.reliability_load --profile cpu-default --requests 200 --concurrency 32 \\
      --rounds 4 --max-tokens 16,32 --name cpu-default
  python -m benchmarks.reliability_load --profile cpu-default --steps 3 --sampled 0.33 --drop 0.1 ...

starts the server itself (`launch/serve.sh --profile P`, or `python -m server --model M
--draft D` without --profile) and writes benchmarks/results/reliability/load_<name>.json and
.md (with the command). `--url URL --pid PID` measures a server that is already running.
tests/test_reliability_load.py runs the same code on tiny models in CI.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import psutil

from benchmarks import prom_text
from benchmarks.report import md_table, provenance, write_result
from benchmarks.server_proc import free_port, wait_healthy

PROJECT_ROOT = Path(__file__).resolve().parent.parent
RESULTS = PROJECT_ROOT / "benchmarks" / "results" / "reliability"

COMPLETION_PROMPTS = [
    "def fibonacci(n):", "import numpy as np\n", "class Stack:\n    def __init__(self):", "The capital of France is",
    "Once upon a time", "for i in range(10):", "# Sort a list of numbers\n", "SELECT name FROM users WHERE",
    "The three laws of motion are", "def parse_args():", "A haiku about the sea:\n", "while True:",
    "Q: What is 12 times 12?\nA:", "<html>\n<head>", "Dear team,\n", "if __name__ == '__main__':",
]
CHAT_PROMPTS = ["Write a function that reverses a string.", "What is a list?", "Explain recursion briefly.",
                "Say hello in three languages."]


@dataclass
class Result:
    status: int
    text: str = ""
    completion_tokens: int = -1
    finish_reason: str | None = None
    error: str | None = None
    dropped: bool = False           # the client hung up on purpose (item["drop_after"])

    def same_output(self, other: Result) -> bool:
        return (self.text, self.completion_tokens, self.finish_reason) == \
            (other.text, other.completion_tokens, other.finish_reason)


def request_mix(n: int, max_tokens: list[int], completion_prompts=COMPLETION_PROMPTS, chat_prompts=CHAT_PROMPTS,
                model: str | None = None, seed: int = 0) -> list[dict]:
    """n greedy streaming requests cycling over every (prompt, max_tokens) pair, both endpoints,
    in a shuffled order (so equal requests rarely run side by side)."""
    distinct = []
    for m in max_tokens:
        for p in completion_prompts:
            distinct.append({"path": "/v1/completions", "body": {"prompt": p, "max_tokens": m}})
        for p in chat_prompts:
            distinct.append({"path": "/v1/chat/completions",
                             "body": {"messages": [{"role": "user", "content": p}], "max_tokens": m}})
    for d in distinct:
        d["body"].update(temperature=0, stream=True, stream_options={"include_usage": True})
        if model:
            d["body"]["model"] = model
    items = [distinct[i % len(distinct)] for i in range(n)]
    random.Random(seed).shuffle(items)
    return items


def vary(items: list[dict], sampled: float, drop: float, seed: int = 0) -> list[dict]:
    """Copies of `items` where a `sampled` fraction gets random sampling parameters (and is
    marked "sampled") and a `drop` fraction of clients hangs up after 1-3 streamed chunks
    ("drop_after"); the two are drawn independently."""
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


async def stream_one(client: httpx.AsyncClient, url: str, item: dict) -> Result:
    text, usage, finish, chunks = [], None, None, 0
    try:
        async with client.stream("POST", url + item["path"], json=item["body"]) as r:
            if r.status_code != 200:
                return Result(r.status_code, error=(await r.aread()).decode(errors="replace")[:500])
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return Result(200, "".join(text), error=json.dumps(chunk["error"]))
                for c in chunk.get("choices") or []:
                    text.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
                    finish = c.get("finish_reason") or finish
                usage = chunk.get("usage") or usage
                chunks += 1
                if chunks == item.get("drop_after"):  # leaving the `async with` closes the connection
                    return Result(200, "".join(text), dropped=True)
    except httpx.HTTPError as e:
        return Result(-1, "".join(text), error=f"{type(e).__name__}: {e}")
    if usage is None:
        return Result(200, "".join(text), error="no usage chunk")
    return Result(200, "".join(text), usage["completion_tokens"], finish)


async def run_concurrent(url: str, items: list[dict], concurrency: int, timeout_s: float = 600) -> list[Result]:
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        async def one(item):
            async with sem:
                return await stream_one(client, url, item)
        return await asyncio.gather(*(one(i) for i in items))


def gauges(url: str) -> tuple[float, float]:
    """(running, waiting) from /metrics."""
    values = prom_text.parse_totals(httpx.get(url + "/metrics", timeout=10).text)
    return values["specserve_num_requests_running"], values["specserve_num_requests_waiting"]


def wait_idle(url: str, timeout_s: float = 10) -> tuple[float, float]:
    """Poll until running and waiting are 0 (the last stream's slot is released right after its
    final chunk was sent); return the last reading."""
    deadline = time.monotonic() + timeout_s
    while True:
        load = gauges(url)
        if load == (0, 0) or time.monotonic() > deadline:
            return load
        time.sleep(0.02)


def rss_mb(pid: int) -> float:
    """Resident memory of the server and every process under it (the engine runs in a child)."""
    root = psutil.Process(pid)
    procs = [root] + root.children(recursive=True)
    return sum(p.memory_info().rss for p in procs if p.is_running()) / 2**20


def bad_sample(r: Result) -> bool:
    """A sampled output read to its end that did not finish normally with at least one token."""
    return not r.dropped and (r.completion_tokens < 1 or r.finish_reason not in ("stop", "length"))


def run(url: str, pid: int | None, items: list[dict], concurrency: int, rounds: int) -> dict:
    """Alone pass (each distinct greedy request once, sequentially, read to its end), then
    `rounds` concurrent rounds."""
    distinct = list({key(i): {"path": i["path"], "body": i["body"]} for i in items if not i.get("sampled")}.values())
    t0 = time.perf_counter()
    alone = {key(i): asyncio.run(run_concurrent(url, [i], 1))[0] for i in distinct}
    alone_s = time.perf_counter() - t0
    out = {"requests": len(items), "distinct": len(distinct), "concurrency": concurrency, "alone_s": round(alone_s, 2),
           "alone_errors": sum(r.error is not None for r in alone.values()), "rounds": [],
           "rss_mb_before": round(rss_mb(pid), 1) if pid else None}
    for n in range(1, rounds + 1):
        t0 = time.perf_counter()
        results = asyncio.run(run_concurrent(url, items, concurrency))
        wall = time.perf_counter() - t0
        errors = [r for r in results if r.error is not None]
        greedy = [(i, r) for i, r in zip(items, results) if r.error is None and not r.dropped and not i.get("sampled")]
        mismatches = [(i, r) for i, r in greedy if not r.same_output(alone[key(i)])]
        sampled = [(i, r) for i, r in zip(items, results) if r.error is None and i.get("sampled")]
        bad = [(i, r) for i, r in sampled if bad_sample(r)]
        load = wait_idle(url)
        tokens = sum(max(r.completion_tokens, 0) for r in results)
        out["rounds"].append({
            "round": n, "wall_s": round(wall, 2), "tokens": tokens, "tok_s": round(tokens / wall, 1),
            "errors": len(errors), "greedy_compared": len(greedy), "mismatches": len(mismatches),
            "sampled": len(sampled), "sampled_bad": len(bad), "dropped": sum(r.dropped for r in results),
            "idle_running": load[0], "idle_waiting": load[1],
            "rss_mb": round(rss_mb(pid), 1) if pid else None,
            "first_error": asdict(errors[0]) if errors else None,
            "first_mismatch": {"request": mismatches[0][0], "got": asdict(mismatches[0][1]),
                               "alone": asdict(alone[key(mismatches[0][0])])} if mismatches else None,
            "first_bad_sample": {"request": bad[0][0], "got": asdict(bad[0][1])} if bad else None,
        })
    rss = [r["rss_mb"] for r in out["rounds"]]
    if pid and len(rss) >= 2:
        base = rss[1] if len(rss) >= 3 else rss[0]  # the first round warms allocator pools up
        out["rss_growth_after_warmup"] = round((rss[-1] - base) / base, 4)
    return out


def markdown(result: dict) -> str:
    cols = ["round", "wall s", "tokens", "tok/s", "errors", "greedy compared", "outputs != alone", "sampled (bad)",
            "dropped", "running, waiting after", "RSS MiB"]
    rows = [[r["round"], r["wall_s"], r["tokens"], r["tok_s"], r["errors"], r["greedy_compared"], r["mismatches"],
             f"{r['sampled']} ({r['sampled_bad']})", r["dropped"], f"{r['idle_running']:.0f}, {r['idle_waiting']:.0f}",
             r["rss_mb"]] for r in result["rounds"]]
    lines = [f"# Reliability load: {result['requests']} streaming requests at concurrency {result['concurrency']}",
             "", f"Command: `{result['provenance']['command']}`", "",
             f"Server: {result.get('server', '-')}", "",
             (f"Alone pass: {result['distinct']} distinct requests sequentially in {result['alone_s']} s, "
              f"{result['alone_errors']} errors. RSS before the rounds: {result['rss_mb_before']} MiB."), "",
             md_table(cols, rows).rstrip("\n")]
    if "rss_growth_after_warmup" in result:
        lines += ["", f"RSS growth from round 2 to the last round: {100 * result['rss_growth_after_warmup']:.2f} %"]
    lines += ["", (f"Verdict: {'PASS' if passed(result) else 'FAIL'} (zero errors, every greedy output read to its end "
                   "equal to the request alone, every sampled one finished with tokens, gauges back at 0 after "
                   "every round, RSS growth after warm-up < 5 %)")]
    return "\n".join(lines) + "\n"


def passed(result: dict, max_growth: float = 0.05) -> bool:
    ok = result["alone_errors"] == 0 and all(
        r["errors"] == 0 and r["mismatches"] == 0 and r["sampled_bad"] == 0
        and (r["idle_running"], r["idle_waiting"]) == (0, 0)
        for r in result["rounds"])
    return ok and result.get("rss_growth_after_warmup", 0.0) < max_growth


def start_server(model: str, draft: str | None, port: int, max_batch: int, log_path: Path, threads: int | None,
                 profile: str | None = None, steps: int | None = None) -> subprocess.Popen:
    """`python -m server` for a model pair, or `launch/serve.sh --profile P` (serve.sh execs
    Python, so the pid is the server's either way); `steps`: --steps for either."""
    if profile:
        cmd = [str(PROJECT_ROOT / "launch" / "serve.sh"), "--profile", profile, "--port", str(port)]
    else:
        cmd = [sys.executable, "-m", "server", "--model", model, "--port", str(port), "--max-batch", str(max_batch),
               "--device", "cpu", "--log-level", "warning"] + (["--draft", draft] if draft else [])
    cmd += ["--steps", str(steps)] if steps else []
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "PATH": os.path.dirname(sys.executable) + os.pathsep +
           os.environ.get("PATH", "")}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(PROJECT_ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--profile", help="start launch/serve.sh --profile PROFILE (its model, drafter, batch)")
    ap.add_argument("--model", default="shipped/target")
    ap.add_argument("--draft", default="shipped/drafter", help="'' for no speculation")
    ap.add_argument("--url", help="measure a running server instead of starting one (needs --pid for RSS)")
    ap.add_argument("--pid", type=int)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-tokens", default="16,32", help="comma-separated max_tokens values to mix")
    ap.add_argument("--steps", type=int, help="--steps for the server it starts (a profile's speculation on)")
    ap.add_argument("--sampled", type=float, default=0.0, help="fraction of requests with random sampling parameters")
    ap.add_argument("--drop", type=float, default=0.0, help="fraction of clients that hang up mid-stream")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--threads", type=int, help="OMP_NUM_THREADS for the server it starts")
    ap.add_argument("--name", default="shipped")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    prov = provenance(argv)
    proc, url, pid = None, args.url, args.pid
    if url is None:
        port = free_port()
        log = PROJECT_ROOT / "runs" / "reliability" / f"load_{args.name}.log"  # git-ignored
        proc = start_server(args.model, args.draft or None, port, args.max_batch, log, args.threads, args.profile,
                            args.steps)
        url, pid = f"http://127.0.0.1:{port}", proc.pid
    try:
        wait_healthy(url, proc)
        model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        items = vary(request_mix(args.requests, [int(m) for m in args.max_tokens.split(",")], model=model),
                     args.sampled, args.drop)
        result = run(url, pid, items, args.concurrency, args.rounds)
    finally:
        if proc is not None:
            proc.terminate()  # our own child, by pid
            proc.wait(60)
    started = (f"launch/serve.sh --profile {args.profile}" if args.profile else
               f"python -m server --model {args.model} --draft {args.draft} --max-batch {args.max_batch}")
    started += f" --steps {args.steps}" if args.steps else ""
    result["server"] = (f"{started} (OMP_NUM_THREADS={args.threads or 'unset'}), {os.cpu_count()} CPU cores"
                        if proc is not None else url)
    result["provenance"] = prov
    write_result(Path(args.out) / f"load_{args.name}.json", result, markdown(result))
    return 0 if passed(result) else 1


if __name__ == "__main__":
    raise SystemExit(main())
