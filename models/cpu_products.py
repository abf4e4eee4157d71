"""Which form of a few-row float32 product is faster on this CPU, timed once per process.

`F.linear` (x @ W.T) and `few_rows_cpu` (W @ x.T) read the same weights once, but which of the
library's kernels each reaches depends on the processor: on session 9's AMD EPYC VM, W @ x.T was
1.3-2.5x faster for 1-4 rows; on session 12's Intel Xeon VM it was 2-2.5x slower
(benchmarks/results/cpu_linear/). A fixed choice is wrong on one of them, so the engine times both
on a matrix larger than the caches (a decode step's weights are read from memory) and takes
W @ x.T only for the row counts where it is clearly faster. Both forms give the same products up
to float32 rounding.
"""
from __future__ import annotations

import functools
import statistics
import time

import torch

from models.layers import CPU_FEW_ROWS, few_rows_cpu

# 57 MB of float32 weights in SmolLM2's width: beyond a VM's share of the last-level cache.
CALIBRATION_SHAPE = (24576, 576)
MARGIN = 0.10  # W @ x.T must be this share faster to be chosen: F.linear is the library's default


def _median_ms(fn, x: torch.Tensor, w: torch.Tensor, reps: int) -> float:
    fn(x, w)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(x, w)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


@functools.cache
def faster_few_rows(threads: int, reps: int = 3) -> frozenset[int]:
    """Row counts (1..CPU_FEW_ROWS) at which few_rows_cpu beats F.linear by MARGIN at `threads`
    intra-op threads (the caller's current count; cached per count)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w = torch.randn(CALIBRATION_SHAPE, generator=torch.Generator().manual_seed(0))
        won = set()
        for n in range(1, CPU_FEW_ROWS + 1):
            x = torch.randn(n, w.shape[1])
            if _median_ms(few_rows_cpu, x, w, reps) < (1 - MARGIN) * _median_ms(torch.nn.functional.linear, x, w, reps):
                won.add(n)
        return frozenset(won)
    finally:
        torch.set_num_threads(saved)
