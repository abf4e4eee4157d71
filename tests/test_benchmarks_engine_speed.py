"""benchmarks/engine_speed: settings side by side in the engine's own loop (engine_load at
concurrency 1). With synthetic acceptance of 1.0 a random pair's chain accepts every draft,
so each verify step yields steps + 1 tokens; a real pair's JSON has a row per setting.
Timings are never checked."""
import json
from pathlib import Path

import pytest

from benchmarks import engine_speed

ROOT = Path(__file__).resolve().parent.parent


def test_synthetic_acceptance_sets_the_tokens_per_step(tmp_path):
    rows = engine_speed.main(["--shape", "tiny", "--device", "cpu", "--steps", "0,2", "--synthetic-accept", "1,1",
                              "--num-prompts", "2", "--prompt-len", "8", "--max-tokens", "16",
                              "--json", str(tmp_path / "s.json")])
    plain, chain = rows
    assert plain["tokens_per_step"] == 1.0 and plain["speedup"] == 1.0
    assert chain["tokens_per_step"] == 3.0 and chain["decode_tokens_per_reply"] == 15  # 5 steps of 3
    assert json.loads((tmp_path / "s.json").read_text())["synthetic_acceptance"] == [1.0, 1.0]


def test_real_pair(tmp_path):
    rows = engine_speed.main(["--model", str(ROOT / "shipped/target"), "--draft", str(ROOT / "shipped/drafter"),
                              "--device", "cpu", "--steps", "0,3", "--num-prompts", "2", "--max-tokens", "16",
                              "--prompts", str(ROOT / "shipped/data/heldout_prompts.jsonl")])
    assert [r["steps"] for r in rows] == [0, 3] and all(r["tok_per_s"] > 0 for r in rows)
    assert rows[1]["accept_length"] > 1.5  # the shipped drafter is accepted
    with pytest.raises(SystemExit):
        engine_speed.main(["--model", str(ROOT / "shipped/target"), "--steps", "3"])  # no --draft
