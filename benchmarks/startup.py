"""Start-up with compile: cold (empty inductor cache) and warm (the cache a first start left),
and whether any request waits for a compile after the engine reports ready.

Each start is a fresh process (dynamo's in-memory caches do not carry over; inductor's disk
cache in TORCHINDUCTOR_CACHE_DIR does): it builds the native engine as the server does
(engine.loading.build_engine: load, then BatchDecoder.warm_up compiles and captures every
batch size up to --max-batch with the steps table in force), times it, then at once, with no
warm-up, serves the prompts at each --concurrency (benchmarks/engine_load.py) and reports the
longest gap between two deltas of one request: a compile or capture inside serving shows there.
Each start also reports its seconds in torch.compile's phases (dynamo's tracing, the backend or
inductor's cache): a warm start's rest is loading, graph capture and warm-up runs. --saved-steps
starts the engine with compile_cache in the cache folder: the warm start loads its decode steps.
--no-compile starts eager steps instead (the server's default), whose graphs are captured then.
Without --model, a random pair of --shape (benchmarks/shapes.py) is built on the device in place
of loading one, and random prompts run to --max-tokens: compile and capture cost the same.

  python -m benchmarks.startup --model M --draft D --steps-by-batch 1=4,4=3,32=1 --max-batch 32 \\
      --dtype bfloat16 --cache-dir /tmp/inductor --out benchmarks/results/startup/h200.json
  python -m benchmarks.startup --shape 8b --draft random --steps 3 --max-batch 32 --cache-dir /tmp/ind --out s.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.report import md_table, provenance, write_result


def child(args) -> dict:
    """One start in this process: engine ready time, then max gaps per concurrency."""
    t0 = time.perf_counter()
    import torch

    from benchmarks.engine_load import load_prompts, run_load
    from benchmarks.shapes import random_pair
    from engine.decoder import SpecConfig
    from engine.loading import LoadedModels, NativeEngineArgs, build_engine
    imported = time.perf_counter() - t0
    table = tuple(tuple(int(x) for x in e.split("=")) for e in args.steps_by_batch.split(",")) \
        if args.steps_by_batch else ()
    spec = SpecConfig(max(s for _, s in table), steps_by_batch=table) if table else SpecConfig(args.steps)
    eargs = NativeEngineArgs(model=args.model or f"random-{args.shape}", draft=args.draft,
                             spec=spec if args.draft else None, device=args.device, dtype=args.dtype,
                             max_batch=args.max_batch, max_context=args.max_context, compile=not args.no_compile,
                             compile_max_batch=args.max_batch, prefill_graphs=args.prefill_graphs,
                             compile_prefill=args.compile_prefill,
                             compile_cache=str(Path(args.cache_dir) / "steps") if args.saved_steps else "")
    loaded = None
    if not args.model:
        target, drafter, device = random_pair(args.shape, args.device, args.dtype)
        loaded = LoadedModels(target, drafter if args.draft else None, device, tokenizer=None)
    engine = build_engine(eargs, loaded)
    engine.start_blocking()
    ready = time.perf_counter() - t0
    compile_s = compile_seconds()
    n = max(args.concurrency) * 2
    prompts = load_prompts(args.prompts, engine.tokenizer, n) if args.model else \
        torch.randint(0, target.config.vocab_size, (n, 128), generator=torch.Generator().manual_seed(0)).tolist()
    loads = []
    for c in args.concurrency:
        r = run_load(engine, prompts[:2 * c], c, args.max_tokens, ignore_eos=not args.model)
        loads.append({"concurrency": c, "max_gap_ms": r.max_gap_s * 1000, "throughput": r.throughput,
                      "accept_length": r.accept_length})
        print(f"c={c}: max gap {r.max_gap_s * 1000:.0f} ms, {r.throughput:.1f} tok/s", flush=True)
    engine.stop_blocking()
    return {"import_s": imported, "ready_s": ready, "compile_s": compile_s, "loads": loads,
            "saved_compiles": engine.decoder.saved_compiles()}


# compile_times' phases: a compile's total is "_compile.compile_inner" for a lazy torch.compile and
# "fullgraph_capture" for one ahead of time (--saved-steps), each dynamo's tracing plus the backend
# (AOT autograd and inductor, or their cache). Coordinate-descent tuning runs at a kernel's first
# launch, outside them: a warm start that finds no tuned config in the cache tunes again.
PHASES = {"compiling": ("_compile.compile_inner", "fullgraph_capture"), "tracing": ("bytecode_tracing",),
          "backend": ("create_aot_dispatcher_function", "AOTAutogradCache.inductor_load"),
          "tuning": ("CachingAutotuner.coordinate_descent_tuning",)}


def phase_seconds(compile_s: dict[str, float]) -> dict[str, float]:
    return {phase: round(sum(compile_s.get(k, 0.0) for k in keys), 1) for phase, keys in PHASES.items()}


def compile_seconds() -> dict[str, float]:
    """Seconds this process spent in each of torch.compile's timed phases so far (dynamo's
    tracing, the backend, inductor's codegen or its cache): what a warm start still pays, and
    what of ready_s is neither (loading, graph capture, warm-up runs)."""
    from torch._dynamo.utils import compile_times
    headers, rows = compile_times(repr="csv", aggregate=True)
    return {name: round(float(value), 3) for name, value in zip(headers, rows)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="checkpoint (default: a random pair of --shape)")
    ap.add_argument("--shape", default="8b", choices=["8b", "smollm2", "tiny"], help="the random pair, without --model")
    ap.add_argument("--draft", help="the drafter of --model ('random' with --shape); none: plain decoding")
    ap.add_argument("--steps", type=int, default=3, help="without --steps-by-batch")
    ap.add_argument("--steps-by-batch", help="size=steps,... e.g. 1=4,4=3,32=1")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--max-context", type=int, default=1024)
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--prompts", default=str(Path(__file__).resolve().parent.parent / "shipped" / "smollm2" /
                                             "heldout" / "chat.jsonl"))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--no-compile", action="store_true",
                    help="eager steps: on GPU their CUDA graphs are captured on first use, after ready")
    ap.add_argument("--prefill-graphs", action="store_true", help="capture short prompts' prefills (compiled too)")
    ap.add_argument("--no-compile-prefill", dest="compile_prefill", action="store_false",
                    help="with --prefill-graphs: capture them uncompiled")
    ap.add_argument("--cache-dir", required=True, help="TORCHINDUCTOR_CACHE_DIR (emptied for the cold start)")
    ap.add_argument("--saved-steps", action="store_true",
                    help="compile the decode steps ahead of time into CACHE_DIR/steps (the engine's compile_cache), "
                         "which the warm start loads instead of tracing")
    ap.add_argument("--out", help="JSON to write (.md beside it)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    if args.child:
        import logging
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        print("RESULT " + json.dumps(child(args)), flush=True)
        return {}
    shutil.rmtree(args.cache_dir, ignore_errors=True)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": args.cache_dir}
    starts = {}
    for kind in ("cold", "warm"):
        cmd = [sys.executable, "-m", "benchmarks.startup", "--child", *(argv if argv is not None else sys.argv[1:])]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode or line is None:
            raise RuntimeError(f"{kind} start failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                               f"{proc.stderr[-3000:]}")
        starts[kind] = {**json.loads(line[7:]), "process_s": wall}
        if args.out:   # the child's log: the engine's own lines (saved steps loaded or compiled, warnings)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).with_suffix(f".{kind}.log").write_text(proc.stderr)
        p = phase_seconds(starts[kind]["compile_s"])
        print(f"{kind}: ready in {starts[kind]['ready_s']:.1f} s (compiling {p['compiling']} s: dynamo's tracing "
              f"{p['tracing']} s, the backend {p['backend']} s; coordinate-descent tuning {p['tuning']} s); "
              f"saved compiles loaded/compiled: {starts[kind]['saved_compiles'] or '-'}", flush=True)
    result = {"settings": {k: v for k, v in vars(args).items() if k != "child"}, "starts": starts,
              "provenance": provenance(argv)}
    if args.out:
        rows = [[kind, round(s["ready_s"], 1), *phase_seconds(s["compile_s"]).values()]
                + [round(x["max_gap_ms"]) for x in s["loads"]] for kind, s in starts.items()]
        table = md_table(["start", "engine ready s", "compiling s", "of which tracing s", "of which backend s",
                          "coordinate-descent tuning s"]
                         + [f"max gap ms, c={c}" for c in args.concurrency], rows)
        title = f"# Start-up {'without' if args.no_compile else 'with'} compile"
        write_result(Path(args.out), result, f"{title}\n\n`{result['provenance']['command']}`\n\n{table}")
    return result


if __name__ == "__main__":
    main()
