"""Compiled decode steps made while the engine serves eager ones (NativeConfig.compile_before_ready false).

The serving process never compiles. A worker process of its own (`python -m engine.compile_worker`,
at a lower CPU priority) loads the same models, builds the same decoder and warms up each decode shape,
which compiles it ahead of time into compile_cache (engine/saved_compile.py); after each shape it says so
on its stdout. The serving process then loads the saved compile in a thread of its own (`BackgroundCompiles`)
and marks the shape ready: from the next engine step on it runs compiled (BatchDecoder.mark_ready).
Compiles saved by an earlier start are loaded before the worker starts, and a start that finds every
shape saved starts no worker.

Loading waits for an idle engine. Loading is Python that holds the GIL (torch's deserialization imports
hundreds of modules the first time, unpickles the artifact, builds its guards), and an eager step waits
for the GIL at each of its ops, so beside a load a step takes many times its length. So the loading
thread loads while the engine has nothing running or waiting; a request that arrives during a load is
slowed while it lasts (the switch interval shortened to keep each wait short). An engine never idle
for IDLE_WAIT_S loads beside its steps. The first call of a loaded step costs about what the next ones
do, so marking it ready is free.

Why a process and not a thread. Tracing and inductor's code generation are Python that holds the GIL,
and every eager op releases and retakes it, so an eager step waits behind the compiler at each of its
hundreds of ops. And a compiled step warmed up on a second thread opens a second OpenMP team: with more
workers than cores, libgomp stops spinning between parallel regions, and every later eager step of the
engine thread waits for sleeping workers (on 2 shared cores a 42 ms step took 1.3 s after a compile in a
thread). The loading thread runs no parallel op: it unpickles the artifact and checks its guards.

The step costs that choose the steps table and the CPU product forms are measured first, with no
compile beside them: at load where the tuning cache holds them, else while serving (engine/tuning.py),
and the worker starts once they are applied. It is given that table and the kernel plan (the forms
among it), so it compiles exactly the steps this process serves.
"""
from __future__ import annotations

import gc
import json
import logging
import pickle
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

log = logging.getLogger("specserve.engine")

NICE = 10   # the worker's CPU priority below the server's: serving steps come first on a busy machine
IDLE_WAIT_S = 60.0   # the longest a saved compile waits for an idle engine before loading beside its steps
LOAD_SWITCH_INTERVAL_S = 0.0002   # while loading: an engine op waits this long for the GIL, not 5 ms
# The log lines that time the start (benchmarks/startup.py reads them).
COMPILING = "serving eager decode steps while a worker process compiles %s"
SWAPPED_IN = ("%s compiled in %.0f s (loaded in %.2f s after waiting %.1f s for an idle engine); "
              "%d of %d decode shapes compiled")


@dataclass
class CompileJob:
    """What the worker needs to build the serving process's decoder: its settings (NativeEngineArgs),
    the steps table in force, the models' kernel plan (CPU product forms included), and the shapes to
    compile, in order ((padded rows, draft steps, rows), ...); `prefills` with captured prefills."""
    args: object
    steps_by_batch: tuple
    plan: object   # models.kernel_plan.KernelPlan
    shapes: list[tuple[int, int, int]]
    prefills: bool = False


def shape_label(key: tuple) -> str:
    if key == ("prefill",):
        return "prefills"
    return f"{key[0]} row{'s' if key[0] > 1 else ''} x {key[1]} draft steps"


@dataclass
class CompileStatus:
    """Which decode shapes run compiled now, which are still compiling (eager meanwhile), which stay eager."""
    compiled: list[str] = field(default_factory=list)
    compiling: list[str] = field(default_factory=list)
    eager: list[str] = field(default_factory=list)
    error: str | None = None
    tuning: dict = field(default_factory=dict)   # engine/tuning.Tuning.status(): what is measured, still measuring

    def as_dict(self) -> dict:
        d = {"compiled": self.compiled, "compiling": self.compiling, "eager": self.eager}
        return d | ({"error": self.error} if self.error else {}) | ({"tuning": self.tuning} if self.tuning else {})


class BackgroundCompiles:
    """The serving side: loads what a compile from an earlier start saved, starts the worker for the rest,
    and marks each shape ready as its compile loads. `on_change(status)` is called from its thread."""

    def __init__(self, decoder, args, max_rows: int, on_change: Callable[[CompileStatus], None] = lambda s: None,
                 after=None):
        self.decoder, self.args, self.max_rows, self.on_change = decoder, args, max_rows, on_change
        self.after = after   # engine/tuning.Tuning: measurements that choose the steps to compile, taken first
        self.idle: Callable[[], bool] = lambda: True   # the engine's: nothing running or waiting
        self.compiled: list[tuple] = []
        self.error: str | None = None
        self.worker: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None
        self.started = time.perf_counter()
        self._stop = threading.Event()
        self._plan()
        decoder.serve_compiled_when_ready()

    def _plan(self) -> None:
        """The shapes to compile and the worker's job, from the steps table and product forms in force."""
        decoder = self.decoder
        shapes = decoder.decode_shapes(self.max_rows)
        self.rows = {(padded, steps): rows for (padded, steps), rows in shapes.items()}
        self.pending: list[tuple] = [("prefill",)] * decoder.compiles_prefills + list(self.rows)
        self.eager = [key for key in decoder.decode_shapes(decoder.max_batch) if key not in self.rows]
        self.job = CompileJob(self.args, decoder.spec.steps_by_batch if decoder.spec else (),
                              decoder.target.kernel_plan, [])

    @property
    def status(self) -> CompileStatus:
        """While measurements are still taken (`after`), `compiling` lists the shapes of the table served meanwhile."""
        measuring = self.after.status() if self.after is not None else {}
        return CompileStatus([shape_label(k) for k in self.compiled], [shape_label(k) for k in self.pending],
                             [shape_label(k) for k in self.eager], self.error, measuring)

    @property
    def done(self) -> bool:
        return not self.pending

    def start(self) -> None:
        """Starts loading and compiling now, or once the measurements of `after` are applied."""
        if self.after is not None and not self.after.done:
            self.after.on_done.append(self._start)
        else:
            self._start()

    def _start(self) -> None:
        if self.after is not None:
            self._plan()
        self.thread = threading.Thread(target=self._run, name="compile-loader", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.worker is not None and self.worker.poll() is None:
            self.worker.kill()
            self.worker.wait(10)

    def _run(self) -> None:
        try:
            self._load_saved()
            if self.pending and not self._stop.is_set():
                self._compile_elsewhere()
        except Exception as e:  # noqa: BLE001 - the engine serves on, eager where nothing compiled
            log.exception("background compiles failed; the shapes not compiled stay eager")
            self._give_up(f"{type(e).__name__}: {e}")

    def _load_when_idle(self) -> tuple[int, float, float]:
        """Loads what was saved since the last look, once the engine is idle (or after IDLE_WAIT_S):
        (compiles loaded, seconds waited, seconds loading). What the load made joins the heap the
        collector skips (gc.freeze, as at start-up), so no later collection walks it during a step."""
        t0 = time.perf_counter()
        while not self.idle() and time.perf_counter() - t0 < IDLE_WAIT_S and not self._stop.is_set():
            time.sleep(0.02)
        t1, switch = time.perf_counter(), sys.getswitchinterval()
        sys.setswitchinterval(LOAD_SWITCH_INTERVAL_S)
        try:
            loaded = self.decoder.refresh_saved_compiles()
        finally:
            sys.setswitchinterval(switch)
        gc.freeze()
        return loaded, t1 - t0, time.perf_counter() - t1

    def _load_saved(self) -> None:
        """Every shape that a compile saved by an earlier start accepts: ready at once."""
        loaded, _, seconds = self._load_when_idle()
        ready = [key for key in self.pending if self._accepts(key)]
        for key in ready:
            self._ready(key)
        if loaded:
            log.info("loaded %d saved compiles in %.1f s: %d of %d decode shapes compiled at once", loaded,
                     seconds, len(ready), len(ready) + len(self.pending))
        self.on_change(self.status)

    def _accepts(self, key: tuple) -> bool:
        if key == ("prefill",):
            return self.decoder.saved_prefills_accept()
        return self.decoder.saved_compiles_accept(*key)

    def _ready(self, key: tuple) -> None:
        self.decoder.mark_ready(key)
        self.pending = [k for k in self.pending if k != key]
        self.compiled = self.compiled + [key]

    def _compile_elsewhere(self) -> None:
        self.job.prefills = ("prefill",) in self.pending
        self.job.shapes = [(*key, self.rows[key]) for key in self.pending if key != ("prefill",)]
        log.info(COMPILING, ", ".join(shape_label(k) for k in self.pending))
        self.worker = subprocess.Popen([sys.executable, "-m", "engine.compile_worker"], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parent.parent)
        self.worker.stdin.write(pickle.dumps(self.job))
        self.worker.stdin.flush()   # stdin stays open: the worker exits when it closes (this process gone)
        for line in self.worker.stdout:
            if self._stop.is_set():
                return
            news = json.loads(line)
            key = tuple(news["shape"])
            _, waited, seconds = self._load_when_idle()
            if self._accepts(key):
                self._ready(key)
                log.info(SWAPPED_IN, shape_label(key), news["seconds"], seconds, waited, len(self.compiled),
                         len(self.compiled) + len(self.pending))
            else:
                log.warning("%s: the compile the worker saved does not load here; it stays eager", shape_label(key))
                self.pending = [k for k in self.pending if k != key]
                self.eager = self.eager + [key]
            self.on_change(self.status)
        code = self.worker.wait()
        if self.pending and not self._stop.is_set():
            self._give_up(f"the compile worker exited with code {code}")
        elif not self._stop.is_set():
            log.info("every decode shape compiled, %.0f s after serving began", time.perf_counter() - self.started)

    def _give_up(self, why: str) -> None:
        self.error = why
        self.eager, self.pending = self.eager + self.pending, []
        log.warning("%s: serving eager steps for %s", why, ", ".join(shape_label(k) for k in self.eager) or "none")
        self.on_change(self.status)
