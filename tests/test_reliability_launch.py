"""The process that `launch/serve.sh` starts, from the outside:
- start-up checks: a missing or corrupt checkpoint file (config.json missing / not JSON /
  lacking a field, safetensors missing / truncated / with a garbage header), a drafter that
  does not fit its target (hidden size, vocabulary, aux layer ids) or a bad profile value
  stop the launch with ONE error line naming the file and the field, exit code 2, before
  anything listens;
- auth: with an API key (from $SPECSERVE_API_KEY), every /v1 route in the OpenAPI schema and
  unknown /v1 paths refuse a missing key, a wrong key, a key without the Bearer scheme and a
  key in the query string (401); the key never shows in the server log (debug level), in
  /metrics, or in any response;
- SIGTERM: the in-flight stream is drained to [DONE], new connections are refused meanwhile,
  every process the server started is gone and the exit code is 0.
(tests/test_launch_serve.py covers serving and draining on SIGTERM; tests/test_launch_cli.py
the same mismatch checks in-process.)"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from benchmarks.server_proc import free_port, wait_healthy
from tests.server_harness import stream_in_background
from tests.test_launch_serve import SERVE_SH, ServerProc

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-reliability-7f3a9c1e5b"


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny target with a 2048-token context and a random
    drafter for it."""
    from models.llama import load_target
    from tests.tiny import export_drafter, make_target_dir, random_drafter
    root = tmp_path_factory.mktemp("pair")
    target = make_target_dir(root / "target", max_positions=2048)
    return target, export_drafter(random_drafter(load_target(target)), root / "drafter")


def env(**extra) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SPECSERVE_")) and k != "PYTHON"}
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")
    e["OMP_NUM_THREADS"] = "1"
    return {**e, **extra}


# -- start-up checks ----------------------------------------------------------------------------
def _edit_json(file: Path, fn) -> None:
    cfg = json.loads(file.read_text())
    fn(cfg)
    file.write_text(json.dumps(cfg))


def _truncate(file: Path) -> None:
    with open(file, "r+b") as f:
        f.truncate(file.stat().st_size // 2)


def _garbage_header(file: Path) -> None:
    with open(file, "r+b") as f:
        f.write(b"\xff" * 8)


def _aux_ids(cfg: dict) -> None:
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 2, 9]
    cfg["specserve"]["trained_aux_layer_outputs"] = [1, 2, 9]


PROFILE = 'engine = "native"\n[model]\npath = "{t}"\ndraft = "{d}"\n'

# (id, change to the copied pair, extra args, profile text or None, strings the error must contain)
STARTUP = [
    ("target-config-missing", lambda t, d: (t / "config.json").unlink(), [], None,
     ["target/config.json", "not found"]),
    ("target-config-not-json", lambda t, d: (t / "config.json").write_text("{\"hidden_size\": 64,"), [], None,
     ["target/config.json", "not valid JSON"]),
    ("target-config-field-missing", lambda t, d: _edit_json(t / "config.json", lambda c: c.pop("hidden_size")), [],
     None, ["target/config.json", "hidden_size"]),
    ("drafter-config-not-json", lambda t, d: (d / "config.json").write_text("nope"), [], None,
     ["drafter/config.json", "not valid JSON"]),
    ("target-weights-truncated", lambda t, d: _truncate(t / "model.safetensors"), [], None,
     ["target/model.safetensors", "tensor '", "truncated"]),
    ("drafter-weights-garbage-header", lambda t, d: _garbage_header(d / "model.safetensors"), [], None,
     ["drafter/model.safetensors", "not a safetensors file"]),
    ("target-weights-missing-no-spec", lambda t, d: (t / "model.safetensors").unlink(), ["--no-spec"], None,
     ["target", "no *.safetensors weights"]),
    ("hidden-size-mismatch", lambda t, d: _edit_json(d / "config.json", lambda c: c.update(target_hidden_size=128)),
     [], None, ["drafter/config.json", "target_hidden_size 128 != target hidden_size 64", "target/config.json"]),
    ("vocab-mismatch", lambda t, d: _edit_json(d / "config.json", lambda c: c.update(vocab_size=1000)), [], None,
     ["drafter/config.json", "vocab_size 1000 != target vocab_size 512"]),
    ("aux-layer-ids-out-of-range", lambda t, d: _edit_json(d / "config.json", _aux_ids), [], None,
     ["drafter/config.json", "eagle_aux_hidden_state_layer_ids [1, 2, 9]", "4-layer target"]),
    ("profile-max-batch-zero", None, [], PROFILE + "[native]\nmax_batch = 0\n",
     ["profile.toml", "native.max_batch", "must be >= 1"]),
    ("profile-steps-wrong-type", None, [], PROFILE + '[speculative]\nsteps = "three"\n',
     ["profile.toml", "speculative.steps"]),
]


def _launch_fails(pair, tmp: Path, change, args, profile) -> subprocess.CompletedProcess:
    t, d = tmp / "target", tmp / "drafter"
    shutil.copytree(pair[0], t)
    shutil.copytree(pair[1], d)
    if change is not None:
        change(t, d)
    if profile is not None:
        (tmp / "profile.toml").write_text(profile.format(t=t, d=d))
        argv = ["--profile", str(tmp / "profile.toml")]
    else:
        argv = ["--profile", "cpu-default", "--steps", "3", "--model", str(t), "--draft", str(d)]
    return subprocess.run([str(SERVE_SH), *argv, *args, "--port", str(free_port())], env=env(), cwd=str(tmp),
                          capture_output=True, text=True, timeout=120, check=False)


def test_startup_checks_stop_the_launch_with_one_clear_error(pair, tmp_path):
    """All cases run as real launches (two at a time); each must exit 2 before serving."""
    def one(case):
        name, change, args, profile, _ = case
        (tmp_path / name).mkdir()
        return case, _launch_fails(pair, tmp_path / name, change, args, profile)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, STARTUP))
    problems = []
    for (name, _, _, _, want), r in results:
        errors = [line for line in r.stderr.splitlines() if line.startswith("specserve: error:")]
        if r.returncode != 2 or len(errors) != 1 or not all(w in errors[0] for w in want):
            problems.append(f"{name}: rc {r.returncode}, errors {errors}, want {want}\n{r.stderr[-1500:]}")
        elif "Traceback" in r.stderr or "Uvicorn running" in r.stdout + r.stderr:
            problems.append(f"{name}: a traceback or a server start:\n{r.stderr[-1500:]}")
    assert not problems, "\n\n".join(problems)


def test_an_intact_pair_passes_the_checkpoint_check(pair):
    from launch.pair_check import check_checkpoint_files
    summary = check_checkpoint_files(str(pair[0]), str(pair[1]))
    assert summary.startswith("checkpoint files complete: target 1 file,") and "drafter 1 file" in summary


# -- a live server: auth, then SIGTERM ------------------------------------------------------------
@pytest.fixture(scope="module")
def live(pair, tmp_path_factory):
    """serve.sh with an API key from the environment and the server log at debug level."""
    t, d = pair
    root = tmp_path_factory.mktemp("live")
    profile = root / "profile.toml"
    profile.write_text(f'engine = "native"\n[model]\npath = "{t}"\ndraft = "{d}"\n[speculative]\nsteps = 2\n'
                       f'[server]\nlog_level = "debug"\nserved_model_name = "tiny"\n[native]\ndevice = "cpu"\n'
                       f'max_batch = 4\n')
    port = free_port()
    log = root / "server.log"
    with log.open("w") as fh:
        proc = subprocess.Popen([str(SERVE_SH), "--profile", str(profile), "--port", str(port)], stdout=fh,
                                stderr=subprocess.STDOUT, env=env(SPECSERVE_API_KEY=KEY), cwd=str(ROOT))
    srv = ServerProc(proc, f"http://127.0.0.1:{port}", log)
    wait_healthy(srv.url, proc, 120, srv.output)
    yield srv
    if proc.poll() is None:
        srv.stop()


AUTH = {"authorization": f"Bearer {KEY}"}


def _v1_operations(url: str) -> list[tuple[str, str]]:
    spec = httpx.get(url + "/openapi.json", timeout=10).json()
    ops = [(m.upper(), p) for p, item in spec["paths"].items() if p.startswith("/v1/") for m in item]
    assert {("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models")} <= set(ops)
    return ops


def test_every_v1_route_needs_the_key_and_the_key_never_leaks(live):
    url, seen = live.url, []
    ops = _v1_operations(url) + [("GET", "/v1/nope"), ("POST", "/v1/embeddings"), ("DELETE", "/v1/models")]
    bodies = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
              "/v1/completions": {"prompt": "def f(", "max_tokens": 3}}
    refused = [({}, ""), ({"authorization": "Bearer wrong-key"}, ""), ({"authorization": f"Bearer {KEY}x"}, ""),
               ({"authorization": KEY}, ""), ({"authorization": f"Basic {KEY}"}, ""), ({"x-api-key": KEY}, ""),
               ({}, f"?api_key={KEY}"), ({}, f"?key={KEY}&api-key={KEY}")]
    for method, path in ops:
        payload = bodies.get(path)
        for headers, query in refused:
            r = httpx.request(method, url + path + query, json=payload, headers=headers, timeout=30)
            seen.append(r)
            assert r.status_code == 401, (method, path, headers, query, r.status_code, r.text)
            assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
        r = httpx.request(method, url + path, json=payload, headers=AUTH, timeout=30)
        seen.append(r)
        assert r.status_code != 401, (method, path)
        if (method, path) in (("POST", p) for p in bodies) or (method, path) == ("GET", "/v1/models"):
            assert r.status_code == 200, r.text
    stream = httpx.post(url + "/v1/completions", headers=AUTH, timeout=30,
                        json={**bodies["/v1/completions"], "stream": True})
    assert stream.status_code == 200 and stream.text.rstrip().endswith("data: [DONE]")
    for path in ("/health", "/metrics"):  # probes and scrapes stay open
        seen.append(r := httpx.get(url + path, timeout=10))
        assert r.status_code == 200
    metrics = httpx.get(url + "/metrics", headers=AUTH, timeout=10).text
    assert 'specserve_requests_total{finish_reason="length"}' in metrics
    time.sleep(0.2)  # access lines are written when the responses are complete
    log = live.output()
    assert "api key set" in log and '"GET /v1/models HTTP/1.1" 401' in log, log[-2000:]
    for where, text in [("server log", log), ("/metrics", metrics), ("stream", stream.text)] + \
            [(f"{r.request.method} {r.request.url.path}", r.text + str(r.headers)) for r in seen]:
        assert KEY not in text, f"the API key leaked into {where}"


def test_sigterm_drains_refuses_new_connections_and_exits_0(live):
    """Runs last in this module: it stops the shared server."""
    proc = psutil.Process(live.proc.pid)
    assert b"launch.cli" in Path(f"/proc/{proc.pid}/cmdline").read_bytes()  # serve.sh exec'd Python
    children = proc.children(recursive=True)
    events, t = stream_in_background(live.url, live.output, headers=AUTH)
    live.proc.send_signal(signal.SIGTERM)  # our own child, by pid
    at_signal = len(events)
    # A request that arrives before the server has taken the signal is rightly served; the
    # property is about requests after uvicorn has started shutting down.
    shutdown_seen = time.monotonic() + 10
    while "Shutting down" not in live.output() and time.monotonic() < shutdown_seen:
        time.sleep(0.02)
    refused = []
    deadline = time.monotonic() + 10
    while t.is_alive() and time.monotonic() < deadline and len(refused) < 3:
        try:
            r = httpx.post(live.url + "/v1/completions", headers=AUTH, timeout=5,
                           json={"prompt": "x", "max_tokens": 2})
            assert r.status_code == 503, f"a new request was served during the drain: {r.status_code}"
            refused.append(r.status_code)
        except httpx.TransportError as e:  # refused or reset while the listener closes
            refused.append(type(e).__name__)
        time.sleep(0.05)
    drained_while_refusing = t.is_alive()
    rc = live.proc.wait(120)
    t.join(30)
    assert rc == 0, live.output()[-3000:]
    assert refused and drained_while_refusing, (refused, "the stream ended before new requests were tried")
    assert len(events) > at_signal + 1 and events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    assert not psutil.pid_exists(proc.pid) or proc.status() == psutil.STATUS_ZOMBIE
    # The engine process, and multiprocessing's resource tracker, exit once the server has.
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not [c for c in alive if c.status() != psutil.STATUS_ZOMBIE], [c.cmdline() for c in alive]
