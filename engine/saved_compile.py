"""Compiled decode steps saved on disk, so that a restart loads them instead of compiling again.

torch.compile traces and compiles every step function anew in each process. Inductor's cache skips
code generation, but not dynamo's tracing or AOT autograd: on the H200 a warm start of the SmolLM2
pair still spent 18 s tracing and 24 s in the backend (benchmarks/results/h200_s26/).

`torch.compile(...).aot_compile` packages one traced and compiled step into an artifact: its guards,
its graph and inductor's code. A later process loads it and calls it on its own decoder. Weights and
caches are read from that argument, not baked in.

A loaded step still checks its guards on every call (shapes, the step count, the batch range). A call
that no saved step accepts gets a compile of its own, saved beside the others. The guards do not
cover the code that was traced, torch's version or the options, so artifact names carry a
fingerprint of those. Kernels still come from inductor's cache (TORCHINDUCTOR_CACHE_DIR): without it
a load compiles them again.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Callable

import torch

log = logging.getLogger(__name__)
TRACED_PACKAGES = ("engine", "models")   # the code a step traces


def code_fingerprint() -> str:
    """torch's version and the source of the traced packages, hashed."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256(torch.__version__.encode())
    for package in TRACED_PACKAGES:
        for f in sorted((root / package).glob("*.py")):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


class SavedCompile:
    """A device-side step (dec, rows, span_ref, steps) compiled ahead of time, once per signature
    its guards accept. Each artifact is saved in `folder`, and loaded there by the next process.
    If a step cannot be compiled whole (aot_compile needs one graph), the step falls back to a
    lazy torch.compile, with a warning."""

    def __init__(self, fn: Callable, folder: str | Path, name: str, dynamic: bool, options: dict):
        self.fn, self.dynamic, self.options = fn, dynamic, options
        self.folder = Path(folder)
        key = json.dumps([name, dynamic, options, code_fingerprint()], sort_keys=True)
        self.prefix = f"{name}-{'rows' if dynamic else 'b1'}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        self.by_steps: dict[int, list] = {}
        self.lazy: Callable | None = None
        self.loaded = self.compiled = 0   # artifacts loaded from disk / compiled and saved here

    def __call__(self, dec, rows: int, span_ref: torch.Tensor, steps: int):
        args = (dec, rows, span_ref, steps)
        if self.lazy is not None:
            return self.lazy(*args)
        if steps not in self.by_steps:
            self.by_steps[steps] = [self._load(p) for p in sorted(self.folder.glob(f"{self.prefix}-s{steps}-*.aot"))]
        saved = self.by_steps[steps]
        step = next((s for s in saved if s.guard_check(*args)), None)
        if step is None:
            step = self._compile(args, self.folder / f"{self.prefix}-s{steps}-{len(saved)}.aot")
            if step is None:
                return self.lazy(*args)
            saved.append(step)
        return step(*args)

    def _load(self, path: Path):
        with open(path, "rb") as f:
            step = torch.compiler.load_compiled_function(f)
        step.disable_guard_check()   # __call__ checks them, once
        self.loaded += 1
        return step

    def _compile(self, args: tuple, path: Path):
        # The span is symbolic (decoder._span_from_ref): in the batch-1 compile by a mark on the
        # example's span tensor (the batched compile is dynamic in every size). Marked tensors fail
        # a saved step's guards, so the mark goes on a view of its own, and calls pass none.
        # Floats are specialized: with a dynamic batch, a symbolic float makes AOT autograd restart
        # its analysis, which aot_compile does not do (TensorifyScalarRestartAnalysis).
        dec, rows, span_ref, steps = args
        example = span_ref[:]
        if not self.dynamic:
            torch._dynamo.mark_dynamic(example, 0)
        try:
            with torch._dynamo.config.patch(enable_aot_compile=True, specialize_float=True):
                step = torch.compile(self.fn, fullgraph=True, dynamic=self.dynamic or None,
                                     options=self.options).aot_compile(((dec, rows, example, steps), {}))
        except Exception as e:  # noqa: BLE001 - any failure to trace whole: compile lazily instead
            log.warning("%s: not compiled ahead of time (%s: %s); compiling lazily, not saved",
                        self.prefix, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            self.lazy = torch.compile(self.fn, dynamic=self.dynamic or None, options=self.options)
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        step.save_compiled_function(str(path))
        step.disable_guard_check()
        self.compiled += 1
        return step
