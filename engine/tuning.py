"""What the engine measures about this machine, measured while it serves: the CPU float32 product
forms (models/cpu_products.py) and the step costs that choose the steps per batch size
(engine/steps_by_cost.py), where the tuning cache does not hold them yet and the engine serves at
once (NativeConfig.compile_before_ready false).

Measured before ready they kept a first start on 2 CPU cores from answering for a minute. So the
engine serves at once, eager steps with F.linear's products and a provisional table
(steps_by_cost.provisional_steps), and measures on its own thread between two engine steps, a slice
of a few products or steps at a time: back to back while no request is in, and at most BUSY_SHARE of
the thread's time while requests are. On the engine thread itself, because a second thread's
parallel ops open a second OpenMP team (engine/background_compile.py says what that costs), and a
niced process is starved while requests run and then times its steps under their load.

Each result applies between two steps once complete: the forms first (the step costs are timed
with them, on an eager twin of the decoder with caches of its own), then the table chosen from the
costs. Both are kept in the tuning cache as at load, so a restart reads them before ready. Neither
changes a greedy token (tests/test_steps_by_cost.py, tests/test_tuning.py). Then the background
compile starts (`on_done`): it compiles the steps of the forms and table in force.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Iterator

import torch

from engine.steps_by_cost import (
    ROUNDS,
    batch_sizes,
    choose_steps,
    cost_slices,
    costs_entry,
    costs_key,
    costs_path,
    eager_twin,
    from_entry,
)
from models.cpu_forms import CpuForms
from models.cpu_products import REPS, forms_path, kept_entry, machine_key, timing_slices
from models.kept_measurements import kept_measurement
from models.layers import onednn_weights, set_kernel_plan

log = logging.getLogger("specserve.engine")

FORMS, COSTS = "CPU product forms", "step costs"
BUSY_SHARE = 0.25   # the most of the engine thread's time that slices take while requests are in


class Tuning:
    """The measurements still to take (`pending`, in order) and their slices. The engine thread calls
    `between_steps` after each step (and keeps calling while idle) until `done`."""

    def __init__(self, decoder, args, forms: bool, costs: bool):
        self.decoder, self.args = decoder, args
        self.pending = [what for what, wanted in ((FORMS, forms), (COSTS, costs)) if wanted]
        self.measured: list[str] = []
        self.error: str | None = None
        self.on_change: Callable[[], None] = lambda: None   # each result applied (status news)
        self.on_done: list[Callable[[], None]] = []         # once nothing is pending, in the engine thread
        self.started = time.perf_counter()
        self._slices = self._measure()
        self._no_slice_before = 0.0
        meanwhile = (["F.linear's products"] if forms else []) + \
            ([f"steps per batch size {dict(decoder.spec.steps_by_batch)}"] if costs else [])
        log.info("serving before measuring %s: %s meanwhile", " and ".join(self.pending), ", ".join(meanwhile))

    @property
    def done(self) -> bool:
        return not self.pending

    def status(self) -> dict:
        return {"measured": self.measured, "measuring": self.pending} | ({"error": self.error} if self.error else {})

    def between_steps(self, busy: bool) -> None:
        """One slice of measuring, unless requests are in and the last slice was less than
        1 / BUSY_SHARE of its own time ago. A slice that fails leaves what is not measured as it is
        served now (logged), and the background compile starts with it."""
        now = time.perf_counter()
        if self.done or (busy and now < self._no_slice_before):
            return
        try:
            next(self._slices)
        except StopIteration:
            pass
        except Exception as e:  # noqa: BLE001 - the engine serves on with what it has
            log.exception("measuring %s failed; serving on without it", " and ".join(self.pending))
            self.error, self.pending = f"{type(e).__name__}: {e}", []
            self._finish()
        took = time.perf_counter() - now
        self._no_slice_before = now + took / BUSY_SHARE

    def _measure(self) -> Iterator[None]:
        folder = self.args.tuning_cache
        if FORMS in self.pending:
            threads, timings = torch.get_num_threads(), {}
            yield from timing_slices(threads, REPS, timings)
            entry = kept_entry(timings)
            if folder:   # another server may have kept its own first: every server here runs that one
                entry = kept_measurement(forms_path(folder), machine_key(threads), lambda: entry, FORMS)
            forms = CpuForms(tuple((n, form) for n, form in entry["forms"]))
            dec = self.decoder
            if forms.takes_onednn:   # the weights' oneDNN copies, a slice each, before a step needs them all
                yield from onednn_weights(dec.target, dec.drafter)
            set_kernel_plan(dataclasses.replace(dec.target.kernel_plan, cpu_forms=forms), dec.target, dec.drafter)
            log.info("CPU float32 product forms by row count, measured while serving (%.0f s): %s; compiled steps: %s",
                     time.perf_counter() - self.started, ", ".join(f"{n}: {f}" for n, f in forms.measured),
                     forms.compiled)
            self._measured(FORMS)
        if COSTS in self.pending:
            dec, args = self.decoder, self.args
            sizes, costs = batch_sizes(dec.max_batch), {}
            yield from cost_slices(eager_twin(dec), sizes, costs, ROUNDS)
            if folder:
                entry = kept_measurement(costs_path(folder), costs_key(dec, args.model, args.draft, sizes),
                                         lambda: costs_entry(costs), COSTS)
                costs = from_entry(entry)
            dec.set_steps_table(choose_steps(costs, args.speculation.accept_rates))
            log.info("steps per batch size %s from step costs measured while serving (%.0f s; ms at 0..%d steps: %s) "
                     "and accept rates %s", dict(dec.spec.steps_by_batch), time.perf_counter() - self.started,
                     dec.spec.steps, "; ".join(f"{rows} rows " + " / ".join(f"{c:.1f}" for c in ms)
                                               for rows, ms in costs.items()), list(args.speculation.accept_rates))
            self._measured(COSTS)
        self._finish()

    def _measured(self, what: str) -> None:
        self.pending = [p for p in self.pending if p != what]
        self.measured = self.measured + [what]
        if self.pending:
            self.on_change()

    def _finish(self) -> None:
        for f in self.on_done:
            f()
        self.on_change()
