"""`launch/serve.sh --steps 2 --model T --draft D` serves on CPU (no --profile, no GPU: the
embedded default profile; its steps eager here, `--no-compile`), answers the OpenAI API, and on
SIGTERM finishes the request in flight, then exits 0 — the signal reaches Python because serve.sh
execs it.

The helpers here (tiny pair, server process) are shared with tests/test_monitoring_live.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from benchmarks.server_proc import free_port, wait_healthy
from tests.server_harness import stream_in_background

ROOT = Path(__file__).resolve().parent.parent
SERVE_SH = ROOT / "launch" / "serve.sh"


def make_tiny_pair(root: Path) -> tuple[Path, Path]:
    """A random tiny Llama target and a random EAGLE-3 drafter for it (seconds on CPU)."""
    from models.llama import load_target
    from tests.tiny import export_drafter, make_target_dir, random_drafter
    target = make_target_dir(root / "target")
    drafter = export_drafter(random_drafter(load_target(target)), root / "drafter")
    return target, drafter


@dataclass
class ServerProc:
    proc: subprocess.Popen
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # our own child, by pid
            self.proc.wait(10)
            raise


def start_server(args: list[str], log: Path, timeout: float = 240) -> ServerProc:
    """Start serve.sh on a free local port and wait for /health."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SPECSERVE_")) and k != "PYTHON"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["SPECSERVE_CACHE_DIR"] = str(log.parent / "specserve-cache")  # measurements of this machine, this test's
    fh = log.open("w")
    proc = subprocess.Popen([str(SERVE_SH), *args, "--host", "127.0.0.1", "--port", str(port)],
                            stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))
    srv = ServerProc(proc, f"http://127.0.0.1:{port}", log)
    try:
        wait_healthy(srv.url, proc, timeout, srv.output)
    except BaseException:
        srv.stop()
        raise
    return srv


def completion(url: str, model: str, prompt: str = "def main(", max_tokens: int = 16, **kw) -> dict:
    r = httpx.post(url + "/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                                  "temperature": 0, **kw}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    return make_tiny_pair(tmp_path_factory.mktemp("tiny"))


@pytest.mark.slow
def test_serve_sh_steps_2_serves_on_cpu_and_drains_on_sigterm(tiny_pair, tmp_path):
    target, drafter = tiny_pair
    # Eager steps: the default profile's compile is test_smollm2's (`make serve`); here it would add half a minute.
    # A drain long enough for the stream on a busy machine: the bound itself is test_server_cli's.
    srv = start_server(["--steps", "2", "--no-compile", "--model", str(target), "--draft", str(drafter),
                        "--shutdown-timeout", "300"], tmp_path / "server.log")
    try:
        with open(f"/proc/{srv.proc.pid}/cmdline", "rb") as f:  # serve.sh exec'd Python: same pid
            assert b"launch.cli" in f.read()
        out = srv.output()
        assert "profile cpu-default" in out and "EAGLE3 steps 2, topk 1, draft tokens 3" in out
        models = httpx.get(srv.url + "/v1/models", timeout=10).json()
        name = models["data"][0]["id"]
        body = completion(srv.url, name)
        assert body["choices"][0]["text"] and body["usage"]["completion_tokens"] > 0

        # A streaming request in flight when SIGTERM arrives still finishes (uvicorn drains).
        chunks, t = stream_in_background(srv.url, srv.output, model=name)
        at_signal = len(chunks)
        rc = srv.stop(timeout=300)
        t.join(60)
    finally:
        if srv.proc.poll() is None:
            srv.stop()
    assert rc == 0, srv.output()[-3000:]
    assert len(chunks) > at_signal + 1, "the stream ended before SIGTERM: nothing was drained"
    assert chunks[-1] == "[DONE]", chunks[-3:]
    finals = [json.loads(c)["choices"][0].get("finish_reason") for c in chunks[:-1]]
    assert "length" in finals
