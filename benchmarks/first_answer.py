"""A newcomer's first minute: seconds from `launch/serve.sh` (what `make serve` runs after its installs) to
/health ready, to the first answer and to every decode step compiled, and the gaps between streamed
chunks while compiled steps take over, for a cold start (an empty SPECSERVE_CACHE_DIR: product forms,
step costs, compiles and inductor's kernels all made anew) and then a warm restart over the same folder.

The moment /health turns ready one greedy chat request goes out (the first answer); then --clients clients
stream chat requests back to back until /health says no shape is still compiling (and --after seconds
more), recording every chunk's arrival. The server's log lines that mark a shape compiled give the swap
times; the longest gap within --window seconds of one is the swap's gap. /proc/loadavg is sampled every
second beside it all (the machine may be shared).

  .venv/bin/python -m benchmarks.first_answer --out benchmarks/results/2026-12-cpu-epyc-first-minute
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "shipped" / "smollm2" / "heldout" / "chat.jsonl"
SWAP = re.compile(r"^(\S+ \S+) INFO specserve\.engine: (.+) compiled in (\d+) s \(loaded in ([\d.]+) s\)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def stream_chat(url: str, messages: list[dict], max_tokens: int) -> tuple[str, list[float]]:
    """A greedy streamed chat request: its text and each content chunk's arrival (time.time())."""
    body = {"model": "SmolLM2-135M-Instruct", "messages": messages, "temperature": 0, "max_tokens": max_tokens,
            "stream": True}
    text, arrivals = [], []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
            if delta:
                text.append(delta)
                arrivals.append(time.time())
    return "".join(text), arrivals


def health(url: str) -> dict | None:
    try:
        r = httpx.get(url + "/health", timeout=5)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


def one_start(args, kind: str, cache: Path, prompts: list) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECSERVE_")}
    env["SPECSERVE_CACHE_DIR"] = str(cache)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    log_path = Path(args.out) / f"server_{kind}.log"
    loads: list[tuple[float, list[float]]] = []
    stop = threading.Event()

    def sample_load() -> None:
        while not stop.is_set():
            loads.append((time.time(), loadavg()))
            stop.wait(1)
    threading.Thread(target=sample_load, daemon=True).start()
    t0 = time.time()
    with log_path.open("w") as fh:
        proc = subprocess.Popen([str(ROOT / "launch" / "serve.sh"), *args.server_args.split(), "--port", str(port)],
                                stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    try:
        while (h := health(url)) is None:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited {proc.returncode}: {log_path.read_text()[-3000:]}")
            time.sleep(0.1)
        ready = time.time()
        first_text, first_arrivals = stream_chat(url, prompts[0], args.max_tokens)
        first_status = health(url)
        statuses = [(ready, h), (time.time(), first_status)]
        streams: list[dict] = []
        compiled_at: list[float] = []

        def client(i: int) -> None:
            n = i
            while not stop_clients.is_set():
                t = time.time()
                text, arrivals = stream_chat(url, prompts[n % len(prompts)], args.max_tokens)
                streams.append({"prompt": n % len(prompts), "sent": t, "arrivals": arrivals, "text": text})
                n += args.clients

        stop_clients = threading.Event()
        clients = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for c in clients:
            c.start()
        while time.time() - ready < args.timeout:
            h = health(url)
            statuses.append((time.time(), h))
            if h is not None and not h.get("decode_steps", {}).get("compiling"):
                compiled_at.append(time.time())
                break
            time.sleep(0.5)
        time.sleep(args.after)
        stop_clients.set()
        for c in clients:
            c.join()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        stop.set()
    swaps = []
    for line in log_path.read_text().splitlines():
        if m := SWAP.match(line):
            at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            swaps.append({"at": at, "shape": m.group(2), "compile_s": int(m.group(3)), "load_s": float(m.group(4))})
    gaps = [(b, b - a) for s in streams for a, b in zip(s["arrivals"], s["arrivals"][1:])]
    first_gaps = [b - a for a, b in zip(first_arrivals, first_arrivals[1:])]

    def longest(lo: float, hi: float) -> float:
        inside = [g for at, g in gaps if lo <= at <= hi]
        return round(max(inside) * 1000, 1) if inside else None

    end = compiled_at[0] if compiled_at else time.time()
    for s in swaps:
        s["longest_gap_ms_within_window"] = longest(s["at"] - args.window, s["at"] + args.window)
    return {
        "start": kind, "ready_s": round(ready - t0, 2),
        "first_answer_s": round(first_arrivals[-1] - t0, 2) if first_arrivals else None,
        "first_token_s": round(first_arrivals[0] - t0, 2) if first_arrivals else None,
        "first_answer": first_text, "first_answer_longest_gap_ms": round(max(first_gaps, default=0) * 1000, 1),
        "status_at_first_answer": first_status,
        "compiled_s": round(compiled_at[0] - t0, 2) if compiled_at else None,
        "swaps": swaps,
        "longest_gap_ms_while_compiling": longest(ready, end),
        "longest_gap_ms_after_compiled": longest(end, time.time()),
        "median_gap_ms_while_compiling": median_ms([g for at, g in gaps if ready <= at <= end]),
        "median_gap_ms_after_compiled": median_ms([g for at, g in gaps if at > end]),
        "streams": len(streams), "texts_by_prompt": texts_by_prompt(streams, first_text),
        "loadavg": {"at_launch": loads[0][1] if loads else None,
                    "max_1min": max((x[1][0] for x in loads), default=None),
                    "samples": [(round(t - t0, 1), x) for t, x in loads]},
        "statuses": [(round(t - t0, 2), s) for t, s in statuses],
        "chunks": [{"prompt": s["prompt"], "sent_s": round(s["sent"] - t0, 3),
                    "arrivals_s": [round(a - t0, 3) for a in s["arrivals"]]} for s in streams],
    }


def median_ms(xs: list[float]) -> float | None:
    return round(sorted(xs)[len(xs) // 2] * 1000, 1) if xs else None


def texts_by_prompt(streams: list[dict], first: str) -> dict:
    """Each prompt's distinct replies (greedy: one each, whether eager or compiled steps served it)."""
    out: dict[int, set] = {0: {first}}
    for s in streams:
        out.setdefault(s["prompt"], set()).add(s["text"])
    return {str(k): sorted(v) for k, v in sorted(out.items())}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for result.json and the server logs")
    ap.add_argument("--server-args", default="", help="serve.sh's arguments (default: none, the default profile)")
    ap.add_argument("--clients", type=int, default=3, help="clients streaming back to back while compiling")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=1800, help="give up waiting for every shape compiled")
    ap.add_argument("--after", type=float, default=20, help="seconds of load once every shape is compiled")
    ap.add_argument("--window", type=float, default=1.0, help="seconds either side of a swap")
    ap.add_argument("--starts", default="cold,warm")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "specserve-cache"
    shutil.rmtree(cache, ignore_errors=True)
    prompts = [json.loads(line)["messages"] for line in PROMPTS.read_text().splitlines()[:12]]
    starts = {}
    for kind in args.starts.split(","):
        starts[kind] = r = one_start(args, kind, cache, prompts)
        print(f"{kind}: ready {r['ready_s']} s, first answer {r['first_answer_s']} s, compiled {r['compiled_s']} s, "
              f"longest gap while compiling {r['longest_gap_ms_while_compiling']} ms "
              f"(median {r['median_gap_ms_while_compiling']}), swaps "
              f"{[(s['shape'], s['longest_gap_ms_within_window']) for s in r['swaps']]}, "
              f"load at launch {r['loadavg']['at_launch']}", flush=True)
    shutil.rmtree(cache, ignore_errors=True)
    result = {"settings": vars(args), "starts": starts}
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
