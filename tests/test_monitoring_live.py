"""The monitoring assets work against a live CPU server: every metric the Grafana dashboard
queries is exported, and a real Prometheus (Debian's `prometheus`, started here) scrapes the
server and answers the dashboard's accept-length and tok/s PromQL after traffic."""
from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.server_proc import free_port
from tests.test_launch_serve import ROOT, completion, make_tiny_pair, start_server

DASHBOARD = ROOT / "monitoring" / "grafana" / "specserve-dashboard.json"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
STEPS = 2


def dashboard_exprs() -> list[str]:
    def walk(panels):
        for p in panels:
            yield from (t["expr"] for t in p.get("targets", []) if t.get("expr"))
            yield from walk(p.get("panels", []))
    return list(walk(json.loads(DASHBOARD.read_text())["panels"]))


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bspecserve_[a-zA-Z0-9_]+", expr))


def family(name: str) -> str:
    """The metric family of a sample name (a labelled family with no children yet is exported
    as HELP/TYPE only, under the family name)."""
    return re.sub(r"_(bucket|sum|count|total)$", "", name)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("monitoring")
    target, drafter = make_tiny_pair(root)
    # Eager steps: compiling them (cpu-default's, tested by test_smollm2's `make serve`) adds a minute to CI.
    srv = start_server(["--profile", "cpu-default", "--steps", str(STEPS), "--no-compile", "--model", str(target),
                        "--draft", str(drafter)], root / "server.log")
    srv.model = httpx.get(srv.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    completion(srv.url, srv.model, max_tokens=24)
    yield srv
    assert srv.stop() == 0


def scrape(url: str) -> tuple[set[str], dict]:
    text = httpx.get(url + "/metrics", timeout=10).text
    names, samples = set(), {}
    for fam in text_string_to_metric_families(text):
        names.add(fam.name)
        for s in fam.samples:
            names.add(s.name)
            samples.setdefault(s.name, []).append(s)
    return names, samples


def test_every_dashboard_metric_is_exported(server):
    exported, samples = scrape(server.url)
    wanted = {n for e in dashboard_exprs() for n in metric_names(e)}
    assert len(wanted) >= 15
    metrics_src = Path(importlib.util.find_spec("server.metrics").origin).read_text()  # the metric definitions
    missing = []
    for name in sorted(wanted):
        if name in exported or family(name) in exported:
            continue
        # GPU gauges need NVML; without a GPU they may be absent from the scrape, so they must
        # at least be defined where every metric is defined.
        defined = name in metrics_src or name.removeprefix("specserve_") in metrics_src
        if name.startswith("specserve_gpu_") and defined:
            continue
        missing.append(name)
    assert not missing, f"dashboard queries metrics the server does not export: {missing}"
    info = samples["specserve_launch_info"][0].labels
    assert (info["engine"], info["steps"], info["topk"], info["draft_tokens"]) == \
        ("native", str(STEPS), "1", str(STEPS + 1))


def promql(base: str, query: str) -> float | None:
    r = httpx.get(base + "/api/v1/query", params={"query": query}, timeout=10).json()
    assert r["status"] == "success", r
    result = r["data"]["result"]
    if not result:
        return None
    v = float(result[0]["value"][1])
    return None if math.isnan(v) else v


def test_real_prometheus_scrapes_accept_length_and_tokens_per_second(server, tmp_path):
    if not Path(PROMETHEUS).exists():
        pytest.fail("Prometheus is not installed: `apt-get install -y prometheus` (Debian package; CI installs it)",
                    pytrace=False)
    port = free_port()
    host = server.url.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: specserve\n    static_configs:\n      - targets: ['{host}']\n")
    log = (tmp_path / "prometheus.log").open("w")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    exprs = dashboard_exprs()
    accept_expr = next(e for e in exprs if e.startswith("1 + sum(rate(specserve_spec_accepted_tokens_total"))
    toks_expr = next(e for e in exprs if e.startswith("sum(rate(specserve_generation_tokens_total"))
    # The dashboard's own expressions, with Grafana's variables filled in as Grafana would.
    fill = {"$__rate_interval": "1m", "$job": "specserve"}
    for k, v in fill.items():
        accept_expr, toks_expr = accept_expr.replace(k, v), toks_expr.replace(k, v)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.5)
        accept = toks = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and (accept is None or toks is None or toks <= 0):
            completion(server.url, server.model, prompt="class A:\n", max_tokens=16)  # traffic between scrapes
            time.sleep(1.0)
            accept, toks = promql(base, accept_expr), promql(base, toks_expr)
        assert accept is not None and toks is not None, \
            (accept, toks, (tmp_path / "prometheus.log").read_text()[-2000:])
        assert 1.0 <= accept <= STEPS + 1, accept
        assert toks > 0
        assert promql(base, 'up{job="specserve"}') == 1.0
        for e in exprs:  # every dashboard query is valid PromQL for this Prometheus
            for k, v in fill.items():
                e = e.replace(k, v)
            promql(base, e)
    finally:
        prom.terminate()  # our own child, by pid
        prom.wait(30)
        log.close()
