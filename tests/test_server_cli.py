"""`python -m server --model T --draft D` (no --steps) serves with 3 speculative steps,
answers the OpenAI API, and exits 0 on SIGTERM."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.server_proc import wait_healthy
from tests import server_harness as h

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def _stop_servers_at_session_end():
    yield
    h.stop_all()


@pytest.mark.slow
def test_python_m_server_with_draft_defaults_to_3_steps(tmp_path):
    models = h.models()
    port = h.free_port()
    log = (tmp_path / "server.log").open("w")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "NCCL_PROTO": "LL"}
    proc = subprocess.Popen([sys.executable, "-m", "server", "--model", str(models.target), "--draft",
                             str(models.draft), "--port", str(port), "--served-model-name", "tiny",
                             "--max-batch", "4"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, 120, (tmp_path / "server.log").read_text)
        assert httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"] == "tiny"
        r = httpx.post(url + "/v1/completions", timeout=60,
                       json={"model": "tiny", "prompt": h.COMPLETION_PROMPTS[0], "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["spec_decoding"]["verify_steps"] > 0
        info = next(s.labels for f in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text)
                    for s in f.samples if s.name == "specserve_launch_info")
        assert (info["steps"], info["topk"], info["draft_tokens"], info["model"], info["nccl_proto"]) == (
            "3", "1", "4", "tiny", "LL")
    finally:
        proc.send_signal(signal.SIGTERM)  # our own child, by pid
        rc = proc.wait(60)
        log.close()
    assert rc == 0, (tmp_path / "server.log").read_text()
    text = (tmp_path / "server.log").read_text()
    assert '"POST /v1/completions HTTP/1.1" 200 prompt_tokens=' in text


def test_python_m_server_is_specserve_without_a_profile():
    """One launch path: `python -m server` resolves its flags as `specserve --no-profile` does,
    from the engine's defaults, speculating only with a drafter."""
    models = h.models()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "server", "--model", str(models.target), "--dry-run", "--max-batch", "3"]
    out = subprocess.run(base + ["--draft", str(models.draft)], capture_output=True, text=True, env=env,
                         cwd=str(ROOT), timeout=120, check=True).stdout
    assert "profile flags (command line)" in out and "EAGLE3 steps 3, topk 1, draft tokens 4" in out
    assert "native engine arguments:" in out and "max_batch=3" in out and "device='auto'" in out
    out = subprocess.run(base, capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=120, check=True).stdout
    assert "speculative  off" in out and "spec=None" in out


def test_engine_that_cannot_start_ends_the_process(tmp_path):
    """Weights load but the tokenizer is missing: the server exits 1 with the reason instead
    of answering /health with 503 forever."""
    import shutil
    broken = tmp_path / "no_tokenizer"
    broken.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(h.models().target / name, broken / name)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "server", "--model", str(broken), "--port", str(h.free_port())],
                          capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "engine failed to start" in proc.stderr and "tokenizer" in proc.stderr.lower()


@pytest.mark.slow
def test_sigterm_drain_is_bounded_by_shutdown_timeout(tmp_path):
    """A stream that would run for seconds is cut once --shutdown-timeout has passed after
    SIGTERM: the process still exits 0, and promptly."""
    port = h.free_port()
    log = (tmp_path / "server.log").open("w")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "server", "--model", str(ROOT / "shipped" / "target"),
                             "--port", str(port), "--shutdown-timeout", "1"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))
    url = f"http://127.0.0.1:{port}"

    def output() -> str:
        return (tmp_path / "server.log").read_text()
    try:
        wait_healthy(url, proc, 120, output)
        chunks, t = h.stream_in_background(url, output, max_tokens=900)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # our own child, by pid
        rc = proc.wait(60)
        took = time.monotonic() - t0
        t.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert rc == 0, (tmp_path / "server.log").read_text()
    assert took < 10, f"exit took {took:.1f} s with a 1 s drain limit"
    assert "[DONE]" not in chunks, "the 900-token stream finished: the limit was not exercised"


def test_a_model_path_that_is_neither_a_folder_nor_a_gguf_stops_with_exit_2(tmp_path):
    """--model takes an HF folder, a GGUF (file or folder) or pypi:PACKAGE; anything else is
    refused before any loading, naming the flag and the path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for bad in (str(tmp_path / "missing"), "pypi:no_such_package_here"):
        proc = subprocess.run([sys.executable, "-m", "server", "--model", bad], capture_output=True, text=True,
                              env=env, cwd=str(ROOT), timeout=120)
        assert proc.returncode == 2 and "error: --model: model.path: " in proc.stderr and bad in proc.stderr, \
            proc.stderr[-1000:]
