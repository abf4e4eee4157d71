"""Which form of a float32 product is fastest on this CPU at each row count: timed once per
process, or once per machine and kept in a file.

F.linear (x @ W.T), `few_rows_cpu` (W @ x.T) and `onednn_linear` (oneDNN over a prepacked weight)
read the same weights once, but which kernels they reach depends on the processor: on one AMD
EPYC VM W @ x.T was 1.3-2.5x faster than F.linear for 1-4 rows and oneDNN 2.1-4.0x faster at every
count from 1 to 512; on an Intel Xeon VM W @ x.T was 2-2.5x slower. A fixed choice is wrong on
some of them, so the engine times the forms on a matrix larger than the caches (a decode step's
weights are read from memory) at row counts from one token to the longest verify
(CALIBRATED_ROWS), and takes another form than F.linear only where it is clearly faster. All give
the same products up to float32 rounding.

The forms take turns, every (row count, form) once per rep, and each keeps its fastest run (other
work on the machine only adds time, so the minimum drops it, and a busy spell falls on a few runs
of each); another form must beat F.linear by MARGIN. Timed one after the other, by medians and
with a smaller margin, servers started side by side chose differently where the forms are within
6-16%. And `kept_forms` measures once per machine: it keeps the choice, with the timings it came
from, in a file that every later server with the same processor, thread count and torch reads
(models/kept_measurements.py).
"""
from __future__ import annotations

import contextlib
import functools
import json
import time
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F

from models.cpu_forms import CPU_FEW_ROWS, CpuForms, few_rows_cpu, onednn_available, onednn_linear
from models.kept_measurements import kept_entry_if_any, kept_measurement, processor

# 57 MB of float32 weights in SmolLM2's width: beyond a VM's share of the last-level cache.
CALIBRATION_SHAPE = (24576, 576)
# Row counts timed: each up to CPU_FEW_ROWS (decode and short verifies), then verifies of up to 8
# requests (cpu-default's max_batch) of 4 tokens; counts between take the larger's form, longer
# prefills the last's (models/cpu_forms.CpuForms).
CALIBRATED_ROWS = (*range(1, CPU_FEW_ROWS + 1), 12, 16, 24, 32)
# Another form must take this share less time than F.linear (the library's default) to be chosen.
# 10% lets noise flip row counts where the forms are within 6-16% (seen on an Intel VM); a form
# 1.43-4.36x faster (W @ x.T at two threads on an AMD VM) still passes.
MARGIN = 0.20
REPS = 15  # timed runs of each form at each row count


def _forms() -> dict:
    forms = {"linear": F.linear, "few_rows": few_rows_cpu}
    if onednn_available():
        forms["onednn"] = onednn_linear
    return forms


def form_timings(threads: int, reps: int) -> dict[int, dict[str, float]]:
    """Row count -> form -> fastest ms at `threads` intra-op threads (few_rows up to CPU_FEW_ROWS
    rows). Every (row count, form) takes its turn once per rep, so a busy spell on the machine (the
    server's own start-up, beside the engine process) falls on few runs of each, not on all of one."""
    timings: dict[int, dict[str, float]] = {}
    for _ in timing_slices(threads, reps, timings):
        pass
    return timings


@contextlib.contextmanager
def _threads(n: int):
    """`n` intra-op threads inside (set only where the count differs: a serving engine thread has it)."""
    saved = torch.get_num_threads()
    if saved == n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@torch.inference_mode()
def timing_slices(threads: int, reps: int, timings: dict) -> Iterator[None]:
    """form_timings a slice at a time, filling `timings`: it yields after each row count of each rep
    (a few ms of products), so a serving engine thread can run other work between slices
    (engine/tuning.py); each slice times only its own runs."""
    w = torch.randn(CALIBRATION_SHAPE, generator=torch.Generator().manual_seed(0))
    xs = {n: torch.randn(n, w.shape[1]) for n in CALIBRATED_ROWS}
    forms = _forms()
    timings.update({n: {name: float("inf") for name in forms if name != "few_rows" or n <= CPU_FEW_ROWS}
                    for n in xs})
    for rep in range(reps + 1):  # the first runs are untimed
        for n, x in xs.items():
            with _threads(threads):
                for name in timings[n]:
                    t0 = time.perf_counter()
                    forms[name](x, w)
                    if rep:
                        timings[n][name] = min(timings[n][name], (time.perf_counter() - t0) * 1000)
            yield


def fastest_forms(timings: dict[int, dict[str, float]]) -> CpuForms:
    """At each row count the fastest form that beats F.linear by MARGIN, else F.linear."""
    def pick(ms: dict[str, float]) -> str:
        fast = {name: t for name, t in ms.items() if t < (1 - MARGIN) * ms["linear"]}
        return min(fast, key=fast.get) if fast else "linear"
    return CpuForms(tuple((n, pick(ms)) for n, ms in sorted(timings.items())))


@functools.cache
def measured_forms(threads: int, reps: int = REPS) -> CpuForms:
    """The form of each row count at `threads` intra-op threads (the caller's current count;
    cached per count)."""
    return fastest_forms(form_timings(threads, reps))


def machine_key(threads: int) -> str:
    """What the choice depends on: the processor, the thread count, torch and the calibration."""
    return json.dumps([processor(), threads, torch.__version__, CALIBRATION_SHAPE, CALIBRATED_ROWS,
                       sorted(_forms()), MARGIN])


def kept_entry(timings: dict[int, dict[str, float]]) -> dict:
    """What the tuning cache keeps: the choice and the timings it came from."""
    return {"forms": [list(p) for p in fastest_forms(timings).measured],
            "ms": {n: {name: round(t, 4) for name, t in ms.items()} for n, ms in timings.items()}}


def forms_path(folder: str) -> Path:
    return Path(folder) / "cpu_products.json"


def kept_forms_if_any(threads: int, folder: str) -> CpuForms | None:
    """The forms kept in `folder` for this machine, or None where none are kept yet (nothing measured)."""
    entry = kept_entry_if_any(forms_path(folder), machine_key(threads))
    return CpuForms(tuple((n, form) for n, form in entry["forms"])) if entry else None


@functools.cache
def kept_forms(threads: int, folder: str) -> CpuForms:
    """measured_forms, measured once per machine key and kept in `folder`/cpu_products.json with
    its timings (models/kept_measurements.py)."""
    entry = kept_measurement(forms_path(folder), machine_key(threads),
                             lambda: kept_entry(form_timings(threads, REPS)), "CPU product forms")
    return CpuForms(tuple((n, form) for n, form in entry["forms"]))
