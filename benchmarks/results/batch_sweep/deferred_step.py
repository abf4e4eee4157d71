"""One decode step's cost at 0 draft steps (the drafter deferred) next to a plain step and a
1-step chain, in one process, the three decoders' steps interleaved (6 rounds of 8 steps,
alternating order; medians), 300-token prompts, 1 torch thread, float32, the SmolLM2 pair.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/results/batch_sweep/deferred_step.py \
        > benchmarks/results/batch_sweep/deferred_step.txt

runs/smollm2-hf: `drafter export-hf` of the PyPI GGUF (float32).
"""
import statistics
import time

import torch

from engine.decoder import BatchDecoder, SpecConfig
from engine.loading import NativeEngineArgs, load_models
from engine.sampling import BatchSampling

torch.set_num_threads(1)
args = NativeEngineArgs(model="runs/smollm2-hf", draft="shipped/smollm2/drafter", spec=SpecConfig(3), device="cpu")
target, drafter, _ = load_models(args)
greedy = BatchSampling.all_greedy_rows
for rows in (1, 4, 8):
    decoders = {"plain": (None, None), "deferred": (drafter, SpecConfig(1, steps_by_batch=((8, 0),))),
                "chain1": (drafter, SpecConfig(1))}
    decoders = {k: BatchDecoder(target, d, s, max_batch=rows, max_context=1024) for k, (d, s) in decoders.items()}
    for dec in decoders.values():
        for r in range(rows):
            dec.prefill(r, list(range(100, 400)), greedy(1, "cpu"))
    times = {k: [] for k in decoders}
    for rnd in range(6):
        order = list(decoders.items())
        for name, dec in (order if rnd % 2 else order[::-1]):
            for _ in range(8):
                t = time.perf_counter()
                dec.step(rows, greedy(rows, "cpu"))
                times[name].append(time.perf_counter() - t)
    print(rows, {k: round(statistics.median(v) * 1000, 2) for k, v in times.items()}, flush=True)
