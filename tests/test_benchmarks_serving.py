"""The serving load generator runs against an OpenAI streaming server and writes its report:
JSON with vLLM-style latency summaries, accept length from responses and from /metrics
deltas, markdown and a PNG. Timings are never checked, only shapes and counts."""
import json
import math
import subprocess
import sys

import pytest

from benchmarks import prom_text, serving
from benchmarks.server_proc import free_port, wait_healthy


@pytest.fixture(scope="module")
def mock_url():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.mock_server", "--port", str(port), "--accept", "3",
                             "--step-ms", "0.5"])
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, 10)
    yield url
    proc.terminate()
    proc.wait(10)


def test_serving_report(mock_url, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n"
                       + json.dumps({"prompt": "def f():"}) + "\n")
    result = serving.main(["--base-url", mock_url, "--prompts", str(prompts), "--num-prompts", "6",
                           "--max-concurrency", "2", "--request-rate", "200", "--max-tokens", "10",
                           "--out-dir", str(tmp_path), "--name", "run"])
    for ext in ("json", "md", "png"):
        assert (tmp_path / f"run.{ext}").stat().st_size > 0
    saved = json.loads((tmp_path / "run.json").read_text())
    s = saved["summary"]
    assert s["completed"] == 6 and s["failed"] == 0 and s["total_output_tokens"] == 60
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(s[key]) >= {"mean", "median", "p99"}
    # 10 tokens = 1 (prefill) + 3 verify steps of 3: responses 10/3, /metrics 1 + 6/3.
    assert s["accept_length_responses"] == pytest.approx(10 / 3)
    assert s["accept_length_metrics"] == pytest.approx(3.0)
    assert len(saved["requests"]) == 6 and all(len(r["itl"]) == 3 for r in saved["requests"])
    assert "TPOT" in (tmp_path / "run.md").read_text()
    assert result["provenance"]["command"].startswith("python -m")


def test_prometheus_deltas():
    before = prom_text.parse_totals('# HELP x\nspecserve_spec_verify_steps_total{model="a"} 10\n'
                                    'specserve_spec_accepted_tokens_total{model="a"} 15\n')
    after = prom_text.parse_totals('specserve_spec_verify_steps_total{model="a"} 20\n'
                                   'specserve_spec_verify_steps_total{model="b"} 10\n'
                                   'specserve_spec_accepted_tokens_total{model="a"} 45\n')
    assert prom_text.accept_length_from_deltas(prom_text.deltas(before, after)) == pytest.approx(1 + 30 / 20)
    assert prom_text.accept_length_from_deltas({}) is None


def test_arrivals():
    assert serving.arrival_gaps(4, math.inf, 0) == [0.0] * 4
    gaps = serving.arrival_gaps(2000, 10.0, 0)
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.1)


def test_against_the_real_server(tmp_path):
    """The live specserve server (tiny target + fitted drafter, 3 steps): usage and /metrics agree."""
    from tests.server_harness import CHAT_PROMPTS, MAX_TOKENS, spec_server
    server = spec_server()
    prompts = tmp_path / "chat.jsonl"  # the prompts the harness drafter was fitted on: real acceptance
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": c}]}) + "\n"
                               for c in CHAT_PROMPTS))
    serving.main(["--base-url", server.url, "--prompts", str(prompts), "--num-prompts", "3", "--warmup", "1",
                  "--max-tokens", str(MAX_TOKENS), "--max-concurrency", "2", "--out-dir", str(tmp_path),
                  "--name", "live"])
    s = json.loads((tmp_path / "live.json").read_text())["summary"]
    assert s["completed"] == 3 and s["failed"] == 0
    assert s["accept_length_responses"] >= 1 and s["accept_length_metrics"] >= 1
    d = s["metrics_deltas"]
    assert d[prom_text.GENERATION] == s["total_output_tokens"]
    assert s["accept_length_metrics"] == pytest.approx(1 + d.get(prom_text.ACCEPTED, 0) / d[prom_text.VERIFY_STEPS])
    assert s["accept_length_responses"] > 1.5  # the fitted drafter is accepted
