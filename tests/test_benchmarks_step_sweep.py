"""The step sweep measures baseline, chains and trees side by side, writes JSON/markdown/PNG
with a "best" record, and `best_steps(profile)` reads that record back for --steps auto
(None when there is no usable sweep). In-process on a tiny pair, and over HTTP against the
mock server. Timings are never checked."""
import json
import sys

import pytest

from benchmarks import step_sweep
from models.llama import load_target
from tests.tiny import export_drafter, make_target_dir, random_drafter


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    target_dir = make_target_dir(root / "target", init_std=0.2)
    export_drafter(random_drafter(load_target(target_dir)), root / "drafter")
    return target_dir, root / "drafter"


def check_outputs(out, name, labels):
    for ext in ("json", "md", "png"):
        assert (out / f"{name}.{ext}").stat().st_size > 0
    data = json.loads((out / f"{name}.json").read_text())
    assert [r["setting"] for r in data["rows"]] == labels
    assert data["rows"][0]["speedup"] == pytest.approx(1.0)
    assert set(data["best"]) >= {"steps", "topk", "draft_tokens"}
    assert data["best"]["setting"] in labels
    return data


def test_in_process_sweep_and_best_steps(pair, tmp_path):
    target, drafter = pair
    step_sweep.main(["--profile", "tiny-profile", "--model", str(target), "--draft", str(drafter),
                     "--max-steps", "2", "--trees", "2:2:3", "--num-prompts", "1", "--max-tokens", "8",
                     "--max-context", "256", "--out-dir", str(tmp_path)])
    data = check_outputs(tmp_path, "tiny-profile", ["baseline", "chain 1", "chain 2", "tree 2/2/3"])
    assert [(r["steps"], r["topk"], r["draft_tokens"]) for r in data["rows"]] == [(0, 0, 0), (1, 1, 2), (2, 1, 3),
                                                                                   (2, 2, 3)]
    assert all(r["tok_s"] > 0 and r["accept_length"] >= 1 for r in data["rows"])
    best = step_sweep.best_steps("tiny-profile", results_dir=tmp_path)
    assert {k: best[k] for k in ("steps", "topk", "draft_tokens")} == \
        {k: data["best"][k] for k in ("steps", "topk", "draft_tokens")}
    assert best["source"].endswith("tiny-profile.json")
    assert step_sweep.best_steps("no-such-profile", results_dir=tmp_path) is None
    (tmp_path / "broken.json").write_text("{")
    assert step_sweep.best_steps("broken", results_dir=tmp_path) is None


def test_http_sweep_with_mock_server(tmp_path):
    mock = f"{sys.executable} -m benchmarks.mock_server --port {{port}} --step-ms 0.2"
    step_sweep.main(["--http", "--name", "mock", "--max-steps", "2", "--trees", "", "--num-prompts", "2",
                     "--max-tokens", "9", "--server-cmd", mock + " --accept {draft_tokens}",
                     "--baseline-cmd", mock + " --accept 1", "--out-dir", str(tmp_path)])
    data = check_outputs(tmp_path, "mock", ["baseline", "chain 1", "chain 2"])
    # The mock emits draft_tokens (= steps + 1) tokens per step after the first: accept 9 / 4 steps for chain 1.
    assert data["rows"][1]["accept_length"] == pytest.approx(9 / 4)
    assert data["rows"][2]["accept_length"] == pytest.approx(9 / 3)


def test_http_overhead_report(pair, tmp_path):
    """benchmarks/http_overhead: the HTTP side (mock server here) against the in-process engine."""
    from benchmarks import http_overhead
    target, drafter = pair
    mock = f"{sys.executable} -m benchmarks.mock_server --port {{port}} --accept 2 --step-ms 0.2"
    r = http_overhead.main(["--model", str(target), "--draft", str(drafter), "--steps", "1", "--num-prompts", "1",
                            "--max-tokens", "8", "--max-context", "256", "--server-cmd", mock, "--name", "ho",
                            "--out-dir", str(tmp_path)])
    saved = json.loads((tmp_path / "ho.json").read_text())
    assert saved["ratio"] == pytest.approx(r["http"]["tok_s"] / r["engine"]["tok_s"])
    assert set(saved) >= {"http", "engine", "meets_target"}
    assert "HTTP / engine" in (tmp_path / "ho.md").read_text()
