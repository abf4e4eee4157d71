"""Start-up: seconds from launch to ready, cold (--cache-dir emptied) and then warm (what the first start left
there), and what serving pays after ready.

The engine (the default): each start is a fresh process (dynamo's in-memory caches do not carry over) that
builds the native engine as the server does (engine.loading.build_engine: load, then compile and capture
every batch size up to --max-batch), then at once serves the prompts at each --concurrency (engine_load.py)
and reports the longest gap between two deltas of one request (a compile or capture after ready shows there)
and its seconds in torch.compile's phases. --cache-dir is TORCHINDUCTOR_CACHE_DIR; --saved-steps saves the
compiled steps in CACHE_DIR/steps (the engine's compile_cache) for the warm start to load. Without --model a
random pair of --shape (shapes.py) stands in, and random prompts run to --max-tokens.

The server (--server-args "ARGS"; "" is the default profile): `launch/serve.sh ARGS`, as `make serve` runs it,
with SPECSERVE_CACHE_DIR=--cache-dir. When /health turns ready one chat request goes out (the first answer);
then --clients clients stream (back to back, or --think seconds apart: idle time in which the niced compile
worker gets the CPU) until /health lists no decode shape compiling, and --after seconds more. The gaps
between chunks are reported for each phase the log marks (measuring this machine, compiling, compiled),
with the ten longest and when they came. The log's "compiled in" lines time each swap to a compiled step
and its load before it, and the longest gap from --window seconds before the load to --window seconds
after the swap is its cost. The load average rides along (the machine may be shared).

  python -m benchmarks startup --model M --draft D --steps-by-batch 1=4,32=1 --max-batch 32 --dtype bfloat16 \\
      --cache-dir /tmp/inductor --out runs/startup.json
  python -m benchmarks startup --server-args "--max-batch 2" --clients 1 --cache-dir /tmp/cache --out runs/first.json
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from benchmarks import serving
from benchmarks.engine_load import add_pair_args
from benchmarks.report import md_table, provenance, write_result
from benchmarks.server_proc import free_port, ours, ours_env, server_process
from drafter.prompts import read_records

SWAP = re.compile(r"^(\S+ \S+) INFO specserve\.engine: (.+) compiled in (\d+) s "
                  r"\(loaded in ([\d.]+) s after waiting ([\d.]+) s for an idle engine\)")
COMPILING = re.compile(r"^(\S+ \S+) INFO specserve\.engine: serving eager decode steps while a worker process compiles")
SERVER_PHASES = ("while_measuring", "while_compiling", "after_compiled")   # of a server start, split at the log's lines
# torch.compile's timed phases: a compile's total is "_compile.compile_inner" when lazy and "fullgraph_capture"
# ahead of time (--saved-steps). Coordinate-descent tuning runs at a kernel's first launch, outside them.
PHASES = {"compiling": ("_compile.compile_inner", "fullgraph_capture"), "tracing": ("bytecode_tracing",),
          "backend": ("create_aot_dispatcher_function", "AOTAutogradCache.inductor_load"),
          "tuning": ("CachingAutotuner.coordinate_descent_tuning",)}


def child(args) -> dict:
    """One start of the engine in this process: seconds from its launch (--child T) to ready, then the longest
    gap at each concurrency."""
    from torch._dynamo.utils import compile_times

    from benchmarks.engine_load import engine_args, load_pair, run_load
    from engine.config import SpecConfig
    from engine.loading import build_engine
    imported = time.time() - args.child
    table = tuple(tuple(int(x) for x in e.split("=")) for e in args.steps_by_batch.split(",")) \
        if args.steps_by_batch else ()
    spec = (SpecConfig(max(s for _, s in table), steps_by_batch=table) if table else SpecConfig(args.steps)) \
        if args.draft else None
    loaded, prompts = load_pair(args, spec, max(args.concurrency) * 2)
    engine = build_engine(engine_args(args, spec, max_batch=args.max_batch, compile=not args.no_compile,
                                      compile_max_batch=args.max_batch, compile_cache=str(
                                          Path(args.cache_dir) / "steps") if args.saved_steps else ""), loaded)
    engine.start_blocking()
    ready = time.time() - args.child
    headers, values = compile_times(repr="csv", aggregate=True)
    compile_s = {name: round(float(v), 3) for name, v in zip(headers, values)}
    loads = []
    for c in args.concurrency:
        r = run_load(engine, prompts[:2 * c], c, args.max_tokens, ignore_eos=not args.model)
        loads.append({"concurrency": c, "max_gap_ms": r.max_gap_s * 1000, "throughput": r.throughput,
                      "accept_length": r.accept_length})
    engine.stop_blocking()
    return {"import_s": imported, "ready_s": ready, "compile_s": compile_s, "loads": loads,
            "phases_s": {p: round(sum(compile_s.get(k, 0.0) for k in keys), 1) for p, keys in PHASES.items()},
            "saved_compiles": engine.decoder.saved_compiles()}


def engine_start(args, kind: str, argv: list[str]) -> dict:
    """A start in a fresh process (this tool with --child); its log beside --out."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": args.cache_dir}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.startup", "--child", str(time.time()), *argv], env=env,
                          capture_output=True, text=True)
    Path(args.out).with_suffix(f".{kind}.log").write_text(proc.stderr)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"{kind} start failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {**json.loads(line[7:]), "process_s": time.perf_counter() - t0}


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


async def serve_while_compiling(url: str, items: list[dict], args, t0: float) -> tuple:
    """The first answer, then clients back to back until no decode shape is compiling, and --after more."""
    async with httpx.AsyncClient(timeout=600) as client:
        first = await serving.stream(client, url, items[0], t0)
        status = (await client.get(url + "/health")).json()
        streams, done, loads, compiled = [], asyncio.Event(), [loadavg()], None

        async def one(n: int) -> None:
            while not done.is_set():
                streams.append((n % len(items), await serving.stream(client, url, items[n % len(items)], t0)))
                n += args.clients
                await asyncio.sleep(args.think)
        tasks = [asyncio.create_task(one(i)) for i in range(args.clients)]
        while compiled is None and time.perf_counter() - t0 < args.timeout:
            loads.append(loadavg())
            if not (await client.get(url + "/health")).json().get("decode_steps", {}).get("compiling"):
                compiled = time.perf_counter() - t0
            await asyncio.sleep(0.5)
        await asyncio.sleep(args.after)
        done.set()
        await asyncio.gather(*tasks)
    return first, status, streams, compiled, loads


def server_start(args, kind: str) -> dict:
    """A start of launch/serve.sh: ready, the first answer, every shape compiled, the gaps between chunks."""
    port = free_port()
    url, log = f"http://127.0.0.1:{port}", Path(args.out).with_suffix(f".{kind}.log")
    env = {k: v for k, v in ours_env().items() if not k.startswith("SPECSERVE_")}
    env["SPECSERVE_CACHE_DIR"] = str(Path(args.cache_dir).resolve())
    items = serving.requests(read_records(args.prompts)[:12], [args.max_tokens], 12)
    launched, t0, at_launch = time.time(), time.perf_counter(), loadavg()
    with server_process(ours([*shlex.split(args.server_args), "--port", str(port)]), log, env, url, args.timeout):
        ready = time.perf_counter() - t0
        first, status, streams, compiled, loads = asyncio.run(serve_while_compiling(url, items, args, t0))
        end = time.perf_counter() - t0
    gaps = [(b, b - a) for _, r in streams for a, b in zip(r.arrivals(), r.arrivals()[1:])]

    def gaps_ms(lo: float, hi: float, pick=max) -> float | None:
        inside = [g for at, g in gaps if lo <= at <= hi]
        return round(pick(inside) * 1000, 1) if inside else None

    def since_launch(stamp: str) -> float:
        return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp() - launched

    lines = log.read_text().splitlines()
    # Measuring this machine (tuning) comes first, then the worker compiles; a warm start may do neither.
    compiling = next((since_launch(m[1]) for m in map(COMPILING.match, lines) if m), None)
    swaps = []
    for m in filter(None, map(SWAP.match, lines)):
        at = since_launch(m[1])
        load_s = float(m[4])
        swaps.append({"at_s": round(at, 2), "shape": m[2], "compile_s": int(m[3]), "load_s": load_s,
                      "waited_for_idle_s": float(m[5]),
                      "longest_gap_ms_within_window": gaps_ms(at - load_s - args.window, at + args.window)})
    texts: dict[int, set] = {0: {first.text}}
    for prompt, r in streams:
        texts.setdefault(prompt, set()).add(r.text)
    compiled_or_end = compiled or end
    measured = compiling or compiled_or_end
    return {"ready_s": round(ready, 2), "first_token_s": round(first.start + first.ttft, 2),
            "first_answer_s": round(first.start + first.e2e, 2), "first_answer": first.text,
            "status_at_first_answer": status, "compiled_s": compiled and round(compiled, 2), "swaps": swaps,
            "compiling_from_s": compiling and round(compiling, 2),
            "longest_gap_ms_while_measuring": gaps_ms(ready, measured),
            "median_gap_ms_while_measuring": gaps_ms(ready, measured, statistics.median),
            "longest_gap_ms_while_compiling": gaps_ms(measured, compiled_or_end),
            "median_gap_ms_while_compiling": gaps_ms(measured, compiled_or_end, statistics.median),
            "longest_gap_ms_after_compiled": gaps_ms(compiled_or_end, end),
            "median_gap_ms_after_compiled": gaps_ms(compiled_or_end, end, statistics.median),
            "longest_gaps": [{"at_s": round(at, 2), "ms": round(g * 1000, 1)}
                             for at, g in sorted(gaps, key=lambda x: -x[1])[:10]], "streams": len(streams),
            "errors": sum(not r.ok for _, r in streams), "texts_by_prompt": {k: sorted(v) for k, v in texts.items()},
            "loadavg": {"at_launch": at_launch, "max_1min": max(loads)}}


def markdown(result: dict, args) -> str:
    starts = result["starts"]
    if args.server_args is not None:
        rows = [[kind, s["ready_s"], s["first_answer_s"], s["compiled_s"],
                 *(f"{s[f'longest_gap_ms_{p}']} ({s[f'median_gap_ms_{p}']})" for p in SERVER_PHASES),
                 ", ".join(f"{w['longest_gap_ms_within_window']}" for w in s["swaps"]) or None, s["streams"],
                 max(map(len, s["texts_by_prompt"].values()))] for kind, s in starts.items()]
        table = md_table(["start", "ready s", "first answer s", "every shape compiled s",
                          *(f"longest (median) gap {p.replace('_', ' ')} ms" for p in SERVER_PHASES),
                          "longest gap at each swap ms", "streams", "texts per prompt (most)"], rows)
    else:
        rows = [[kind, round(s["ready_s"], 1), *s["phases_s"].values()] + [round(x["max_gap_ms"]) for x in s["loads"]]
                for kind, s in starts.items()]
        table = md_table(["start", "engine ready s", "compiling s", "of which tracing s", "of which backend s",
                          "coordinate-descent tuning s"] + [f"max gap ms, c={c}" for c in args.concurrency], rows)
    return f"# Start-up\n\n`{result['provenance']['command']}`\n\n{table}"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON to write (.md and each start's .cold.log, .warm.log beside)")
    ap.add_argument("--cache-dir", required=True, help="emptied for the cold start (see above)")
    ap.add_argument("--claim", help="the sentence the result backs, for manifest.json beside --out")
    engine = ap.add_argument_group("the engine (--draft none: plain decoding)")
    add_pair_args(engine, ["8b", "smollm2", "tiny"])
    engine.set_defaults(max_tokens=64)
    engine.add_argument("--steps", type=int, default=3, help="without --steps-by-batch")
    engine.add_argument("--steps-by-batch", help="size=steps,... e.g. 1=4,4=3,32=1")
    engine.add_argument("--max-batch", type=int, default=16)
    engine.add_argument("--concurrency", default="1,2,4,8,16")
    engine.add_argument("--no-compile", action="store_true", help="eager steps (CUDA graphs captured on first use)")
    engine.add_argument("--saved-steps", action="store_true", help="compiled steps saved in CACHE_DIR/steps")
    engine.add_argument("--child", type=float, help=argparse.SUPPRESS)   # this process's launch (time.time())
    server = ap.add_argument_group("the server")
    server.add_argument("--server-args", help="start `launch/serve.sh SERVER_ARGS` instead of the engine")
    server.add_argument("--clients", type=int, default=3, help="clients streaming back to back while compiling")
    server.add_argument("--think", type=float, default=0.0, help="seconds each client waits between requests")
    server.add_argument("--timeout", type=float, default=1800, help="seconds to wait for every shape compiled")
    server.add_argument("--after", type=float, default=20, help="seconds of load once every shape is compiled")
    server.add_argument("--window", type=float, default=1.0, help="seconds before a load and after its swap")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    if args.child is not None:
        import logging
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        print("RESULT " + json.dumps(child(args)), flush=True)
        return {}
    shutil.rmtree(args.cache_dir, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    starts = {}
    for kind in ("cold", "warm"):
        s = starts[kind] = server_start(args, kind) if args.server_args is not None else engine_start(args, kind, argv)
        print(f"{kind}: " + ", ".join(f"{k} {v}" for k, v in s.items() if k.endswith("_s")), flush=True)
    result = {"settings": {k: v for k, v in vars(args).items() if k != "child"}, "starts": starts,
              "provenance": provenance(argv)}
    write_result(Path(args.out), result, markdown(result, args), claim=args.claim or "Seconds from launch to ready, "
                 f"cold and warm, of {'the server' if args.server_args is not None else 'the engine'}")
    return result


if __name__ == "__main__":
    main()
