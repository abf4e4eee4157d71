"""The monitoring assets are well-formed and cover what operators look at: tok/s, accept
length, accept rate, per-position acceptance, TTFT and ITL p50/p99, running and waiting
requests, GPU utilization and memory — with vLLM's and SGLang's formulas (docs/serving.md)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
MON = ROOT / "monitoring"


def panels() -> dict[str, list[str]]:
    out = {}
    for p in json.loads((MON / "grafana" / "specserve-dashboard.json").read_text())["panels"]:
        if p["type"] != "row":
            out[p["title"]] = [t["expr"] for t in p["targets"]]
    return out


def test_dashboard_has_the_operator_panels_with_design_formulas():
    ps = panels()
    want = {
        "Output tokens/s": "sum(rate(specserve_generation_tokens_total",
        "Accept length": "1 + sum(rate(specserve_spec_accepted_tokens_total",
        "Accept rate": "/ sum(rate(specserve_spec_draft_tokens_total",
        "Per-position acceptance": "sum by (position) (rate(specserve_spec_accepted_tokens_per_position_total",
        "Time to first token p50 / p99":
            "histogram_quantile(0.99, sum by (le) (rate(specserve_time_to_first_token_seconds_bucket",
        "Inter-token latency p50 / p99":
            "histogram_quantile(0.5, sum by (le) (rate(specserve_inter_token_latency_seconds_bucket",
        "Requests running / waiting": "specserve_num_requests_waiting",
        "GPU utilization": "specserve_gpu_utilization_percent",
        "GPU memory used": "specserve_gpu_memory_used_bytes",
    }
    for title, fragment in want.items():
        assert title in ps, f"missing panel {title!r}; have {sorted(ps)}"
        assert any(fragment in e for e in ps[title]), (title, ps[title])
    accept = ps["Accept length"][0]
    assert "/ sum(rate(specserve_spec_verify_steps_total" in accept


def test_dashboard_is_importable_and_provisioned():
    d = json.loads((MON / "grafana" / "specserve-dashboard.json").read_text())
    assert d["uid"] == "specserve" and d["schemaVersion"] >= 36
    assert {v["name"] for v in d["templating"]["list"]} == {"datasource", "job"}
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    ds = yaml.safe_load((MON / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus"
    dash = yaml.safe_load((MON / "grafana" / "provisioning" / "dashboards" / "specserve.yml").read_text())
    assert dash["providers"][0]["type"] == "file"


def test_prometheus_config_scrapes_the_server():
    cfg = yaml.safe_load((MON / "prometheus.yml").read_text())
    job = cfg["scrape_configs"][0]
    assert job["job_name"] == "specserve" and job.get("metrics_path", "/metrics") == "/metrics"
    assert job["static_configs"][0]["targets"] == ["localhost:8000"]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: `apt-get install -y prometheus` (CI installs it)", pytrace=False)
    r = subprocess.run([promtool, "check", "config", str(MON / "prometheus.yml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
