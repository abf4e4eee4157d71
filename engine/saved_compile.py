"""Compiled decode steps saved on disk, so that a restart loads them instead of compiling again.

torch.compile traces and compiles every step function anew in each process. Inductor's cache skips
code generation, but not dynamo's tracing or AOT autograd: on an H200 a warm start of the SmolLM2
pair still spent 18 s tracing and 24 s in the backend.

`torch.compile(...).aot_compile` packages one traced and compiled step into an artifact: its guards,
its graph and inductor's code. A later process loads it and calls it on its own worker
(engine/spec_worker.py). Weights and caches are read from that argument, not baked in.

A loaded step still checks its guards on every call (shapes, the step count, the batch range). A call
that no saved step accepts gets a compile of its own, saved beside the others. The compiled prefills
are saved the same way. The guards do not cover the code that was traced, torch's version, the
options or the models' kernel plan the code reads (models/kernel_plan.py), so artifact names carry a
fingerprint of those; the first call removes the function's artifacts saved under another fingerprint, which no process
of this version loads. Kernels still come from inductor's cache (TORCHINDUCTOR_CACHE_DIR): without
it a load compiles them again.

Another process may compile into the same folder while this one serves (engine/background_compile.py):
an artifact is written under a temporary name and renamed, so a reader never loads half of one, and
`refresh` loads what was saved since, for `saved_step` to find without ever compiling.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Callable

import torch

from models.kernel_plan import KernelPlan

log = logging.getLogger(__name__)
TRACED_PACKAGES = ("engine", "models")   # the code a step traces


def marked(args: tuple, marks: tuple[tuple[int, int], ...]) -> tuple:
    """args with the tensors at the given (argument, dim) marked dynamic, on views of their own:
    the caller's tensors stay unmarked (a marked tensor fails a saved step's guards)."""
    args = list(args)
    for i, dim in marks:
        args[i] = args[i][:]
        torch._dynamo.mark_dynamic(args[i], dim)
    return tuple(args)


@functools.cache
def code_fingerprint() -> str:
    """torch's version and the code of the traced packages, hashed (what they do, not how they
    read: see `code_only`)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256(torch.__version__.encode())
    for package in TRACED_PACKAGES:
        for f in sorted((root / package).glob("*.py")):
            h.update(f.name.encode() + b"\0" + code_only(f.read_text()).encode())
    return h.hexdigest()


def code_only(source: str) -> str:
    """A module's syntax tree without its docstrings, comments, blank lines or line numbers, as text:
    an edit to any of those keeps the saved steps and the kept step costs (engine/steps_by_cost.py),
    which hashing the files' bytes threw away (a docstring edit changed a CPU steps table)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def rejection(step, args: tuple) -> str:
    """The guards of a saved compile that `args` fail, in dynamo's words. It reads the artifact's
    private guard manager, so it is only for the log."""
    try:
        failed = step._artifacts.guard_manager.check_verbose(step.prepare_f_locals(*args)).verbose_code_parts
        return ", ".join(failed) or "no guard named"
    except Exception as e:  # noqa: BLE001 - torch internals may change: the log says so, the call goes on
        return f"no reason available ({type(e).__name__})"


class SavedCompile:
    """A function whose first argument holds the models and state (the speculative worker, the
    prefill), compiled ahead of time once for every call that no earlier compile's guards accept.
    Each compile is saved in `folder` and loaded there by the next process. `marks` are (argument,
    dim) sizes made symbolic in the compile (on the example only: see `marked`). If a function cannot
    be compiled whole (aot_compile needs one graph), it falls back to a lazy torch.compile, with a warning.
    `plan` gives the kernel plan of the models `fn` runs, in force at the first call."""

    def __init__(self, fn: Callable, folder: str | Path, name: str, dynamic: bool, options: dict,
                 marks: tuple[tuple[int, int], ...] = (), plan: Callable[[], KernelPlan] = KernelPlan):
        self.fn, self.dynamic, self.options, self.marks, self.plan = fn, dynamic, options, marks, plan
        self.folder, self.name = Path(folder), name
        self.prefix = ""                  # named at the first call: see _name
        self.saved: list | None = None    # loaded at the first call (or refresh)
        self.paths: set[Path] = set()     # the artifacts in `saved`
        self.lazy: Callable | None = None
        self.loaded = self.compiled = 0   # artifacts loaded from disk / compiled and saved here

    def refresh(self) -> int:
        """Loads the artifacts saved in the folder since the last look (the first look also removes
        stale ones); returns how many. `saved` is replaced, not appended to, so a caller on another
        thread iterating it sees the old list or the new one."""
        if self.saved is None:
            self.prefix = self._name()
            self._remove_stale()
        new = [(p, self._load(p)) for p in sorted(self.folder.glob(f"{self.prefix}-*.aot")) if p not in self.paths]
        self.paths |= {p for p, _ in new}
        self.saved = (self.saved or []) + [s for _, s in new if s is not None]
        return sum(s is not None for _, s in new)

    def saved_step(self, *args):
        """The saved compile whose guards accept `args`, or None; never compiles."""
        if self.saved is None:
            self.refresh()
        return next((s for s in self.saved if s.guard_check(*args)), None)

    def __call__(self, *args):
        if self.lazy is not None:
            return self.lazy(*marked(args, self.marks))
        step = self.saved_step(*args)
        if step is None:
            if self.saved:   # a new shape, or guards that another process's compile fails: say which
                log.info("%s: none of its %d saved compiles accepts this call (%s); compiling another", self.name,
                         len(self.saved), "; ".join(rejection(s, args) for s in self.saved))
            n = 0
            while (path := self.folder / f"{self.prefix}-{n}.aot").exists():
                n += 1
            step = self._compile(args, path)
            if step is None:
                return self.lazy(*marked(args, self.marks))
            self.saved.append(step)
        return step(*args)

    def _name(self) -> str:
        """The artifacts' name: the function, its compile settings, the code's fingerprint and the
        kernel plan the traced code reads (KernelPlan.traced). A saved compile's guards do not
        cover the plan, so a step traced under one plan would load, and run its forms, under
        another (batch_sweep --attention sdpa loaded the written-out steps)."""
        key = json.dumps([self.name, self.dynamic, self.options, self.marks, code_fingerprint(), self.plan().traced()],
                         sort_keys=True)
        return f"{self.name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def _remove_stale(self) -> None:
        """Removes this function's compiles saved under another fingerprint. Those were saved by
        other code, another torch or other options, and no process of this version loads them, so
        without this an upgraded server's folder would only grow."""
        stale = re.compile(rf"{re.escape(self.name)}-[0-9a-f]{{16}}-[0-9]+\.aot")
        for path in self.folder.glob(f"{self.name}-*.aot"):
            if stale.fullmatch(path.name) and not path.name.startswith(self.prefix + "-"):
                log.info("%s: saved by another version, removed", path)
                path.unlink(missing_ok=True)

    def _load(self, path: Path):
        """A saved step, or None (and the file removed) if it does not load: a broken cache entry
        costs a compile, not the engine's start."""
        try:
            with open(path, "rb") as f:
                step = torch.compiler.load_compiled_function(f)
        except Exception as e:  # noqa: BLE001 - whatever is wrong with the file, compile again
            log.warning("%s does not load (%s: %s): removed, to be compiled again", path, type(e).__name__, e)
            path.unlink(missing_ok=True)
            return None
        step.disable_guard_check()   # __call__ checks them, once
        self.loaded += 1
        return step

    def _compile(self, args: tuple, path: Path):
        # Floats are specialized: with a dynamic batch, a symbolic float makes AOT autograd restart
        # its analysis, which aot_compile does not do (TensorifyScalarRestartAnalysis).
        try:
            with torch._dynamo.config.patch(enable_aot_compile=True, specialize_float=True):
                step = torch.compile(self.fn, fullgraph=True, dynamic=self.dynamic or None,
                                     options=self.options).aot_compile((marked(args, self.marks), {}))
        except Exception as e:  # noqa: BLE001 - any failure to trace whole: compile lazily instead
            log.warning("%s: not compiled ahead of time (%s: %s); compiling lazily, not saved",
                        self.prefix, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            self.lazy = torch.compile(self.fn, dynamic=self.dynamic or None, options=self.options)
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        step.save_compiled_function(str(partial))
        partial.replace(path)
        self.paths.add(path)
        step.disable_guard_check()
        self.compiled += 1
        return step
