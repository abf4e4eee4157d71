"""Run an in-process CPU benchmark under Intel's OpenMP instead of torch's libgomp.

Once a process holds more libgomp workers than cores (each thread that opens a parallel region gets a
pool of its own), libgomp stops spinning between regions, and torch's ops on every thread but the first
run 2-3x slower. A tool that serves several engines from threads of their own in one process
(benchmarks/batch_sweep.py) then reads about 1.3x low, and not by the same factor for every setting.
libiomp5, from the intel-openmp package (vLLM's CPU
build preloads it too), answers libgomp's entry points without that cost. The server keeps libgomp: its
engine process runs torch's ops on one thread.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

LIBRARY = "libiomp5.so"


def reexec_under_intel_openmp(module: str) -> None:
    """Replace this process with `python -m module` and the same arguments, libiomp5 preloaded, unless
    it is preloaded already. Without the intel-openmp package, say what the numbers lack and go on."""
    if LIBRARY in os.environ.get("LD_PRELOAD", ""):
        return
    lib = Path(sys.prefix) / "lib" / LIBRARY
    if not lib.is_file():
        print(f"warning: {lib} not found (pip install intel-openmp): under libgomp, engines serving from "
              "threads of one process read about 1.3x low on CPU", file=sys.stderr)
        return
    preload = ":".join(p for p in (str(lib), os.environ.get("LD_PRELOAD", "")) if p)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], {**os.environ, "LD_PRELOAD": preload})
