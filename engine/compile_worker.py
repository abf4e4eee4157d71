"""The background compile's worker process (`python -m engine.compile_worker`, engine/background_compile.py):
it reads a CompileJob on stdin, builds the serving process's decoder, warms up (so compiles and saves) each
shape in turn and writes one JSON line on stdout after each. It exits when its stdin closes, that is when the
serving process ends, however it ends."""
from __future__ import annotations

import json
import logging
import os
import pickle
import sys
import threading
import time

from engine.background_compile import NICE, CompileJob


def worker(job: CompileJob, out) -> None:
    """Build the serving process's decoder from `job` and warm up each shape (compiling it into
    compile_cache); one JSON line on `out` after each."""
    import torch

    from engine.decoder import BatchDecoder
    from engine.loading import load_models
    args = job.args
    target, drafter, device = load_models(args, plan=job.plan)
    spec = args.speculation
    dec = BatchDecoder(target, drafter, spec, args.max_batch, args.max_context or target.config.max_position_embeddings,
                       compile=True, prefill_graphs=args.prefill_graphs, compile_prefill=args.compile_prefill,
                       compile_cache=args.compile_cache, step_width=args.step_width)
    if spec is not None and job.steps_by_batch:
        dec.set_steps_table(job.steps_by_batch)
    with torch.inference_mode():
        if job.prefills:
            t0 = time.perf_counter()
            dec.warm_up_prefills()
            print(json.dumps({"shape": ["prefill"], "seconds": time.perf_counter() - t0}), file=out, flush=True)
        for padded, steps, rows in job.shapes:
            t0 = time.perf_counter()
            dec.warm_up_shape(padded, steps, rows)
            print(json.dumps({"shape": [padded, steps], "seconds": time.perf_counter() - t0}), file=out, flush=True)


def main() -> None:
    os.nice(NICE)
    job = pickle.load(sys.stdin.buffer)

    def exit_with_server() -> None:   # stdin closes when the serving process ends, however it ends
        sys.stdin.buffer.read()
        os._exit(0)
    threading.Thread(target=exit_with_server, daemon=True).start()
    logging.basicConfig(format="%(asctime)s compile worker %(levelname)s %(message)s", level=logging.WARNING)
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr   # stdout carries only the news lines
    worker(job, out)
    out.flush()
    os._exit(0)   # not a normal exit: the thread above holds stdin's lock


if __name__ == "__main__":
    main()
