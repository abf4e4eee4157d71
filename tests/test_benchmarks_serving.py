"""The serving load generator runs against our server and writes its report: JSON with
vLLM-style latency summaries, accept length from responses and from /metrics deltas, and
markdown. Timings are never checked, only shapes and counts."""
import json

import pytest

from benchmarks import serving


def test_prometheus_deltas():
    before = serving.parse_totals('# HELP x\nspecserve_spec_verify_steps_total{model="a"} 10\n'
                                    'specserve_spec_accepted_tokens_total{model="a"} 15\n')
    after = serving.parse_totals('specserve_spec_verify_steps_total{model="a"} 20\n'
                                   'specserve_spec_verify_steps_total{model="b"} 10\n'
                                   'specserve_spec_accepted_tokens_total{model="a"} 45\n')
    assert serving.accept_length_from_deltas(serving.deltas(before, after)) == pytest.approx(1 + 30 / 20)
    assert serving.accept_length_from_deltas({}) is None


def test_report_against_the_real_server(tmp_path):
    """The live specserve server (tiny target + fitted drafter, 3 steps): every request
    completes, usage and /metrics agree on the tokens and the accept length, and the report
    has vLLM's latency summaries and a markdown table."""
    from tests.server_harness import CHAT_PROMPTS, COMPLETION_PROMPTS, MAX_TOKENS, spec_server
    server = spec_server()
    prompts = tmp_path / "prompts.jsonl"  # chat and text prompts the harness drafter was fitted on
    records = [{"messages": [{"role": "user", "content": c}]} for c in CHAT_PROMPTS]
    records.append({"prompt": COMPLETION_PROMPTS[0]})
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = serving.main(["--base-url", server.url, "--prompts", str(prompts), "--num-prompts", "5", "--warmup", "1",
                           "--max-tokens", str(MAX_TOKENS), "--max-concurrency", "2",
                           "--out-dir", str(tmp_path), "--name", "live"])
    for ext in ("json", "md"):
        assert (tmp_path / f"live.{ext}").stat().st_size > 0
    saved = json.loads((tmp_path / "live.json").read_text())
    s = saved["summary"]
    assert s["completed"] == 5 and s["failed"] == 0
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(s[key]) >= {"mean", "median", "p99"}
    assert all(len(r["itl"]) == r["chunks"] - 1 and r["chunks"] <= r["output_tokens"] for r in saved["requests"])
    d = s["metrics_deltas"]
    assert d[serving.GENERATION] == s["total_output_tokens"] == sum(r["output_tokens"] for r in saved["requests"])
    assert s["accept_length_metrics"] == pytest.approx(1 + d.get(serving.ACCEPTED, 0) / d[serving.VERIFY_STEPS])
    assert s["accept_length_responses"] > 1.5  # the fitted drafter is accepted
    assert "TPOT" in (tmp_path / "live.md").read_text()
    assert result["provenance"]["command"].startswith("python -m")
    assert json.loads((tmp_path / "manifest.json").read_text())["command"] == result["provenance"]["command"]
