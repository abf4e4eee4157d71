"""`python -m benchmarks` lists exactly its tools, runs one by name, and the A/B harness's summary
reads the rounds it wrote (made up here: timings are never checked)."""
import json
import subprocess
import sys
from pathlib import Path

from benchmarks import ab
from benchmarks.__main__ import TOOLS

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True)


def test_the_tool_list():
    listed = run()
    assert listed.returncode == 0
    names = [line.split()[0] for line in listed.stdout.splitlines()[2:]]
    assert names == list(TOOLS) == ["serve", "sweep", "ab", "startup", "nccl"]
    assert run("nope").returncode == 2
    usage = run("sweep", "best", "--help")
    assert usage.returncode == 0 and "--curve" in usage.stdout and "benchmarks sweep best" in usage.stdout


def test_ab_summary_ratios_per_round(tmp_path, monkeypatch):
    monkeypatch.setenv("CONC", "1 2 4")
    for r, (table, plain) in enumerate(((30.0, 10.0), (24.0, 12.0)), 1):
        for c in (1, 2, 4):
            for side, tok_s in (("table", table * c), ("plain", plain * c)):
                (tmp_path / f"{side}_r{r}_c{c}.json").write_text(json.dumps(
                    {"summary": {"output_throughput": tok_s, "decode_tok_s": {"median": tok_s}}}))
    text = ab.summary(tmp_path, ["table", "plain"])
    assert "| 1 | 30.0 | 10.0 |" in text and "**2.50x** (2.00-3.00)" in text
    assert (tmp_path / "summary.md").read_text() == text and (tmp_path / "summary.png").stat().st_size > 0


def test_ab_side_by_side_names_our_best_against_vllms(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    for side, tok_s, accept in (("native_plain", 100.0, None), ("native_chain", 240.0, 2.4),
                                ("vllm_plain", 80.0, None), ("vllm_eagle3", 120.0, 2.3)):
        for c in (1, 8):
            (sweep / f"{side}__chat__c{c}.json").write_text(json.dumps({"summary": {
                "output_throughput": tok_s * c, "decode_tok_s": {"mean": tok_s}, "accept_length_responses": accept,
                "completed": 40, "failed": 0}}))
    table = ab.main(["side-by-side", str(sweep), "--out", str(tmp_path / "sbs")])
    assert set(table["chat"]) == {1, 8} and table["chat"][8]["native_chain"]["output_tok_s"] == 1920.0
    text = (tmp_path / "sbs.md").read_text()
    assert "| 1 | 240 / 240 / 2.40 | 100 / 100 |" in text and "2.00x (native_chain / vllm_eagle3)" in text
    assert (tmp_path / "sbs.png").stat().st_size > 0 and json.loads((tmp_path / "sbs.json").read_text())["chat"]
