"""Start an OpenAI-compatible server as a subprocess for one measurement, and stop it after.

Benchmarks that compare settings (steps, engines) start one server per setting from a
command template, so each runs with a fresh engine and its own CUDA graphs.
"""
from __future__ import annotations

import contextlib
import shlex
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base_url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    """Poll /health until it answers 200 (ours, SGLang and vLLM answer 503 or refuse while the
    model loads; /v1/models may answer earlier); fail early when the server process exits."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"server at {base_url} not ready after {timeout_s:.0f} s")


@contextlib.contextmanager
def running_server(template: str, fields: dict, log_path: Path, timeout_s: float = 300.0):
    """Yield the base URL of a server started from `template` ({port} and `fields` filled in)."""
    port = free_port()
    cmd = template.format(port=port, **fields)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        log.write(f"\n### {cmd}\n")
        log.flush()
        proc = subprocess.Popen(shlex.split(cmd), stdout=log, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_ready(base, proc, timeout_s)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
