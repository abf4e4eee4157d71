"""Which form of a few-row float32 product is faster on this CPU, timed once per process.

`F.linear` (x @ W.T) and `few_rows_cpu` (W @ x.T) read the same weights once, but which of the
library's kernels each reaches depends on the processor: on session 9's AMD EPYC VM, W @ x.T was
1.3-2.5x faster for 1-4 rows; on session 12's Intel Xeon VM it was 2-2.5x slower
(benchmarks/results/cpu_linear/). A fixed choice is wrong on one of them, so the engine times both
on a matrix larger than the caches (a decode step's weights are read from memory) and takes
W @ x.T only for the row counts where it is clearly faster. Both forms give the same products up
to float32 rounding.

The two forms take turns and each keeps its fastest run (other work on the machine only adds time,
so the minimum drops it), and W @ x.T must win by MARGIN. Timed one form after the other, by the
median of three runs, with a 10% margin, two servers started side by side on session 31's Intel VM
chose differently (W @ x.T for 4, 7 and 8 rows in one, 7 and 8 in the other), where W @ x.T was
1.06-3.1x slower at every row count; the plain side of that A/B ran its 4-row products 1.56x slower
(benchmarks/results/batch_sweep/cpu_http/ab_s31_interleaved/). Now nine calibrations there, two
pairs of them side by side, all chose F.linear everywhere. Beside another server's load one still
chose W @ x.T for 7 and 8 rows, where the forms are closest, so the A/B scripts start their servers
one after another (benchmarks/results/batch_sweep/cpu_http/servers.sh).
"""
from __future__ import annotations

import functools
import time

import torch

from models.layers import CPU_FEW_ROWS, few_rows_cpu

# 57 MB of float32 weights in SmolLM2's width: beyond a VM's share of the last-level cache.
CALIBRATION_SHAPE = (24576, 576)
# W @ x.T must take this share less time to be chosen (F.linear is the library's default). 10% let
# noise flip row counts where the forms are within 6-16% (Intel, session 31). On the AMD VM at two
# threads (the engine's default on 2 cores) W @ x.T was 1.43-4.36x faster at every row count and
# still passes; at one thread its 6-8 rows (1.00-1.14x) now stay F.linear.
MARGIN = 0.20


def _fastest_ms(forms, x: torch.Tensor, w: torch.Tensor, reps: int) -> list[float]:
    """Each form's fastest of `reps` runs, the forms taking turns."""
    best = [float("inf")] * len(forms)
    for fn in forms:
        fn(x, w)
    for _ in range(reps):
        for i, fn in enumerate(forms):
            t0 = time.perf_counter()
            fn(x, w)
            best[i] = min(best[i], time.perf_counter() - t0)
    return [b * 1000 for b in best]


@functools.cache
def faster_few_rows(threads: int, reps: int = 7) -> frozenset[int]:
    """Row counts (1..CPU_FEW_ROWS) at which few_rows_cpu beats F.linear by MARGIN at `threads`
    intra-op threads (the caller's current count; cached per count)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w = torch.randn(CALIBRATION_SHAPE, generator=torch.Generator().manual_seed(0))
        won = set()
        for n in range(1, CPU_FEW_ROWS + 1):
            few, linear = _fastest_ms((few_rows_cpu, torch.nn.functional.linear), torch.randn(n, w.shape[1]), w, reps)
            if few < (1 - MARGIN) * linear:
                won.add(n)
        return frozenset(won)
    finally:
        torch.set_num_threads(saved)
