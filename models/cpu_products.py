"""Which form of a few-row float32 product is faster on this CPU: timed once per process, or once
per machine and kept in a file.

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

Even so, servers still chose differently. On session 32's AMD VM W @ x.T was 1.9-7.5x faster at
every row count, and four calibrations in a process of their own chose it for 1-8 rows
(benchmarks/results/cpu_linear/calibration_s32_amd.md). Yet servers there chose it for 1-8 rows,
2-8, and [2, 5, 6, 7, 8] (benchmarks/results/batch_sweep/cpu_http/ab_s32_table22/). Each row count
was then timed in one go, a few tens of ms, and the first ones fell in the server's own start-up
beside the engine process. So every (row count, form) now takes its turn once per rep, and a busy
spell falls on a few runs of each. And `kept_few_rows` measures once per machine: it keeps the
choice, with the timings it came from, in a file that every later server with the same processor,
thread count and torch reads (models/kept_measurements.py).
"""
from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import torch

from models.kept_measurements import kept_measurement, processor
from models.layers import CPU_FEW_ROWS, few_rows_cpu

# 57 MB of float32 weights in SmolLM2's width: beyond a VM's share of the last-level cache.
CALIBRATION_SHAPE = (24576, 576)
# W @ x.T must take this share less time to be chosen (F.linear is the library's default). 10% let
# noise flip row counts where the forms are within 6-16% (Intel, session 31). On the AMD VM at two
# threads (the engine's default on 2 cores) W @ x.T was 1.43-4.36x faster at every row count and
# still passes; at one thread its 6-8 rows (1.00-1.14x) now stay F.linear.
MARGIN = 0.20
REPS = 15  # timed runs of each form at each row count: about 1 s in all on session 32's AMD VM


def _timings(threads: int, reps: int) -> dict[int, list[float]]:
    """Row count -> [few_rows_cpu, F.linear] fastest ms at `threads` intra-op threads. Every
    (row count, form) takes its turn once per rep, so a busy spell on the machine (the server's
    own start-up, beside the engine process) falls on few runs of each, not on all of one."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w = torch.randn(CALIBRATION_SHAPE, generator=torch.Generator().manual_seed(0))
        xs = {n: torch.randn(n, w.shape[1]) for n in range(1, CPU_FEW_ROWS + 1)}
        forms = (few_rows_cpu, torch.nn.functional.linear)
        best = {n: [float("inf")] * len(forms) for n in xs}
        for rep in range(reps + 1):  # the first runs are untimed
            for n, x in xs.items():
                for i, fn in enumerate(forms):
                    t0 = time.perf_counter()
                    fn(x, w)
                    if rep:
                        best[n][i] = min(best[n][i], (time.perf_counter() - t0) * 1000)
        return best
    finally:
        torch.set_num_threads(saved)


def _winners(timings: dict[int, list[float]]) -> frozenset[int]:
    return frozenset(n for n, (few, linear) in timings.items() if few < (1 - MARGIN) * linear)


@functools.cache
def faster_few_rows(threads: int, reps: int = REPS) -> frozenset[int]:
    """Row counts (1..CPU_FEW_ROWS) at which few_rows_cpu beats F.linear by MARGIN at `threads`
    intra-op threads (the caller's current count; cached per count)."""
    return _winners(_timings(threads, reps))


def machine_key(threads: int) -> str:
    """What the choice depends on: the processor, the thread count, torch and the calibration."""
    return json.dumps([processor(), threads, torch.__version__, CALIBRATION_SHAPE, CPU_FEW_ROWS, MARGIN])


@functools.cache
def kept_few_rows(threads: int, folder: str) -> frozenset[int]:
    """faster_few_rows, measured once per machine key and kept in `folder`/cpu_products.json with
    its timings (models/kept_measurements.py)."""
    def measure() -> dict:
        timings = _timings(threads, REPS)
        return {"rows": sorted(_winners(timings)), "ms": {n: [round(t, 4) for t in ms] for n, ms in timings.items()}}

    entry = kept_measurement(Path(folder) / "cpu_products.json", machine_key(threads), measure, "CPU product forms")
    return frozenset(entry["rows"])
