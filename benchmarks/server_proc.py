"""A free port for a server and the one wait for its /health, used by benchmarks and tests."""
from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout_s: float = 300.0,
                 output: Callable[[], str] | None = None) -> None:
    """Poll url/health until it answers 200: ours, SGLang and vLLM answer 503 or refuse the
    connection while the model loads (/v1/models may answer earlier). Fail early when `proc`
    exits or our server reports its engine "dead"; errors end with the tail of `output()`
    (the server's log) when given. The one wait for a server, used by benchmarks and tests."""
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
