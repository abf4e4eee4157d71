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

Even so, a borderline row count can still go either way. Session 32's AMD VM chose W @ x.T for
1-8 rows in one server and 2-8 in the next, started after it
(benchmarks/results/batch_sweep/cpu_http/ab_s32_table22/). `kept_few_rows` therefore measures once
per machine and keeps the choice in a file, as inductor and Triton keep their autotuning: every
later server with the same processor, thread count and torch reads it, and runs the same forms. The
file holds the timings the choice came from; delete it to measure again.
"""
from __future__ import annotations

import datetime
import fcntl
import functools
import json
import logging
import os
import platform
import time
from pathlib import Path

import torch

from models.layers import CPU_FEW_ROWS, few_rows_cpu

log = logging.getLogger("specserve.engine")  # the engine log, which the server shows

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


def _timings(threads: int, reps: int) -> dict[int, list[float]]:
    """Row count -> [few_rows_cpu, F.linear] fastest ms at `threads` intra-op threads."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w = torch.randn(CALIBRATION_SHAPE, generator=torch.Generator().manual_seed(0))
        return {n: _fastest_ms((few_rows_cpu, torch.nn.functional.linear), torch.randn(n, w.shape[1]), w, reps)
                for n in range(1, CPU_FEW_ROWS + 1)}
    finally:
        torch.set_num_threads(saved)


def _winners(timings: dict[int, list[float]]) -> frozenset[int]:
    return frozenset(n for n, (few, linear) in timings.items() if few < (1 - MARGIN) * linear)


@functools.cache
def faster_few_rows(threads: int, reps: int = 7) -> frozenset[int]:
    """Row counts (1..CPU_FEW_ROWS) at which few_rows_cpu beats F.linear by MARGIN at `threads`
    intra-op threads (the caller's current count; cached per count)."""
    return _winners(_timings(threads, reps))


def _processor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key(threads: int) -> str:
    """What the choice depends on: the processor, the thread count, torch and the calibration."""
    return json.dumps([_processor(), threads, torch.__version__, CALIBRATION_SHAPE, CPU_FEW_ROWS, MARGIN])


@functools.cache
def kept_few_rows(threads: int, path: str) -> frozenset[int]:
    """faster_few_rows, measured once per machine key and kept in the JSON file at `path` (one
    entry per key, with its timings and date). Servers starting together wait on the file's lock,
    so the first measures and the others read its choice. An unreadable file is measured again."""
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    key = machine_key(threads)
    with open(file.with_name(file.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            kept = json.loads(file.read_text()) if file.exists() else {}
            entry = kept.get(key)
            if entry is not None:
                rows = frozenset(entry["rows"])
                log.info("CPU product forms measured on %s, read from %s", entry["measured"], file)
                return rows
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("%s is unreadable (%s): measuring the CPU product forms again", file, e)
            kept = {}
        timings = _timings(threads, 7)
        rows = _winners(timings)
        kept[key] = {"rows": sorted(rows), "ms": {n: [round(t, 4) for t in ms] for n, ms in timings.items()},
                     "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        tmp = file.with_name(f"{file.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(kept, indent=1) + "\n")
        tmp.replace(file)
        log.info("CPU product forms measured now, kept in %s", file)
        return rows
