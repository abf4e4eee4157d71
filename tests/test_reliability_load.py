"""Under load nothing is lost or leaked: 200 streaming greedy requests at concurrency 32 against
a live `python -m server` process (tiny target + fitted EAGLE-3 drafter, batch 16, so half the
clients queue), four rounds. Every round: zero errors, every output identical to the same
request alone, running/waiting gauges back to 0 (no KV-slot leak), and the server's resident
memory flat from round 2 to round 4 (< 5 % growth). Then the same with a third of the requests
sampled and a tenth of the clients hanging up mid-stream.

The same check on a profile: `python -m benchmarks serve --launch "--profile cpu-default" --check 4 ...`."""
from __future__ import annotations

import pytest

from benchmarks import serving
from benchmarks.server_proc import ours, ours_env, server_process
from tests import server_harness as h

RECORDS = [{"prompt": p} for p in h.COMPLETION_PROMPTS] + [
    {"messages": [{"role": "user", "content": c}]} for c in h.CHAT_PROMPTS]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    models = h.models()
    port = h.free_port()
    log = tmp_path_factory.mktemp("load") / "server.log"
    url = f"http://127.0.0.1:{port}"
    cmd = ours(["--no-profile", "--model", str(models.target), "--draft", str(models.draft), "--device", "cpu",
                "--max-batch", "16", "--port", str(port)])
    with server_process(cmd, log, ours_env(OMP_NUM_THREADS="1"), url, timeout_s=120) as proc:
        yield url, proc


def test_200_streams_at_concurrency_32_lossless_no_slot_or_memory_leak(server):
    url, proc = server
    items = serving.requests(RECORDS, [8, 16, 24], 200, shuffle=True)
    result = serving.check(url, proc.pid, items, concurrency=32, rounds=4)
    assert result["alone_errors"] == 0
    for r in result["rounds"]:
        assert r["errors"] == 0, r["first_error"]
        assert r["mismatches"] == 0, r["first_mismatch"]
        assert (r["idle_running"], r["idle_waiting"]) == (0, 0), f"round {r['round']}: slots still held"
        assert r["tokens"] > 200 * 8 // 2
    assert result["rss_growth_after_warmup"] < 0.05, [r["rss_mb"] for r in result["rounds"]]


def test_sampled_neighbours_and_clients_hanging_up_change_no_greedy_output_and_leak_no_slot(server):
    url, proc = server
    items = serving.vary(serving.requests(RECORDS, [8, 16, 24], 120, shuffle=True), sampled=1 / 3, drop=0.1)
    assert any(i.get("sampled") for i in items) and any("drop_after" in i for i in items)
    result = serving.check(url, proc.pid, items, concurrency=32, rounds=2)
    assert result["alone_errors"] == 0
    for r in result["rounds"]:
        assert r["errors"] == 0, r["first_error"]
        assert r["mismatches"] == 0, r["first_mismatch"]
        assert r["sampled_bad"] == 0, r["first_bad_sample"]
        assert r["dropped"] > 0 and r["sampled"] > 0 and r["greedy_compared"] > 0
        assert (r["idle_running"], r["idle_waiting"]) == (0, 0), f"round {r['round']}: slots still held"
    assert result["passed"]
