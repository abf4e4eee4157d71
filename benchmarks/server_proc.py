"""Server processes for benchmarks and tests: a free port, the one wait for /health, a server started and
stopped (ours as `make serve` runs it, or on vLLM's CPU build)."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"   # `make vllm-venv`


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout_s: float = 300.0,
                 output: Callable[[], str] | None = None) -> None:
    """Poll url/health until it answers 200 (ours, SGLang and vLLM answer 503 or refuse while loading).
    Fail early when `proc` exits or our engine reports "dead"; errors end with the tail of `output()`."""
    def failed(what: str) -> str:
        return f"{url}: {what}" + (f"\n{output()[-4000:]}" if output else "")

    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(failed(f"server exited with {proc.returncode} before it was healthy"))
        try:
            r = httpx.get(url + "/health", timeout=5)
            if r.status_code == 200:
                return
            if r.json().get("status") == "dead":  # our engine failed to load: no point waiting
                raise RuntimeError(failed(f"engine failed to start: {r.text}"))
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(failed(f"not healthy after {timeout_s:.0f} s"))
        time.sleep(0.2)


def ours(args: Sequence[str]) -> list[str]:
    """Our server's command as `make serve` runs it: launch/serve.sh ARGS (with ours_env's python)."""
    return [str(ROOT / "launch" / "serve.sh"), *args]


def ours_env(**extra: str) -> dict:
    """This environment with this interpreter for serve.sh, `extra` added."""
    return {**os.environ, "PYTHON": sys.executable, "PYTHONUNBUFFERED": "1", **extra}


def vllm_env() -> dict:
    """The environment vLLM's CPU guide asks for: its Intel OpenMP runtime preloaded."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    iomp = VLLM_PYTHON.parent.parent / "lib" / "libiomp5.so"
    if iomp.is_file():
        env["LD_PRELOAD"] = ":".join(p for p in (env.get("LD_PRELOAD"), str(iomp)) if p)
    return env


@contextlib.contextmanager
def server_process(cmd: Sequence[str], log: Path, env: dict, url: str,
                   timeout_s: float = 420.0) -> Iterator[subprocess.Popen]:
    """A server process leading its own process group (the command and its output appended to `log`),
    healthy on `url`. Stopped on exit with SIGTERM (our server stops its engine itself), then whatever
    process of its group outlived it (a vLLM engine core, a compile worker) is killed."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        fh.write(("\n### " + " ".join(cmd) + "\n").encode())
        fh.flush()
        proc = subprocess.Popen(list(cmd), cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_healthy(url, proc, timeout_s, lambda: log.read_text(errors="replace"))
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def cpu_vllm_server(log: Path, args: Sequence[str] = (),
                    timeout_s: float = 420.0) -> Iterator[tuple[str, subprocess.Popen]]:
    """Our server with the cpu-vllm profile (`launch.cli`, plus `args`), healthy: (url, process)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(VLLM_PYTHON), "-m", "launch.cli", "--profile", "cpu-vllm", *args, "--port", str(port)]
    with server_process(cmd, log, vllm_env(), url, timeout_s) as proc:
        yield url, proc
