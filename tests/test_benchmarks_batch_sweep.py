"""The step sweep (benchmarks/batch_sweep.py) on the tiny pair of the server tests, in the
engine loop the server runs: plain decoding and chains at each concurrency, every greedy
output equal to plain decoding's (float32), and a result file that `--steps auto` serves
(launch/auto_steps.py reads it through the profile's speculative.sweep_file) and `sweep best`
reads; a random pair's chain accepts at the synthetic rates it is given. Timings are never checked."""
import json

import pytest

from benchmarks import batch_sweep
from engine.config import parse_steps_table
from launch.auto_steps import auto_setting
from launch.profiles import resolve
from tests import server_harness as h


def test_sweep_writes_the_table_steps_auto_serves(tmp_path):
    models = h.models()
    prompts = tmp_path / "chat.jsonl"
    # Written as ShareGPT-derived files are (ensure_ascii=False), a line separator inside one text.
    contents = [h.CHAT_PROMPTS[0] + "\u2028"] + list(h.CHAT_PROMPTS[1:])
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": c}]}, ensure_ascii=False) + "\n"
                               for c in contents), encoding="utf-8")
    out = tmp_path / "sweep.json"
    result = batch_sweep.main(["--model", str(models.target), "--draft", str(models.draft), "--steps", "1,2",
                               "--concurrency", "1,2", "--prompts", str(prompts),
                               "--num-prompts", "4", "--rounds", "1", "--max-tokens", "12", "--max-context", "256",
                               "--device", "cpu", "--out", str(out)])
    assert json.loads(out.read_text())["steps_by_batch"] == result["steps_by_batch"]
    assert out.with_suffix(".md").stat().st_size > 0
    rows = result["rows"] + result["table_rows"]
    assert {(r["setting"], r["concurrency"]) for r in result["rows"]} == {
        (s, c) for s in ("plain", "chain 1", "chain 2", "0 steps") for c in (1, 2)}
    assert all(r["mismatches"] == 0 and r["output_tokens"] > 0 for r in rows), rows
    assert all(r["accept_length"] > 1 for r in rows if r["steps"])
    table = result["steps_by_batch"]
    if table is not None:  # some chain beat plain decoding somewhere: the table was served again
        assert set(table) == {"1", "2"} and parse_steps_table(table)
        assert [(r["setting"], r["concurrency"], r["steps"]) for r in result["table_rows"]] == [
            ("plain again", 1, 0), ("table", 1, table["1"]), ("plain again", 2, 0), ("table", 2, table["2"])]
    profile = resolve("reference").profile
    profile.speculative.sweep_file = str(out)
    choice, message = auto_setting(profile)
    assert choice.steps == (max(table.values()) if table else result["best"]["steps"]), message
    assert choice.topk == 1 and choice.steps_by_batch == table and str(out) in message

    rows = batch_sweep.main(["best", "--sweep", f"tiny={out}", "--out", str(tmp_path / "best")])
    assert [r["concurrency"] for r in rows] == [1, 2] and (tmp_path / "best.png").stat().st_size > 0
    assert "| call |" in (tmp_path / "best.md").read_text()


def test_synthetic_acceptance_sets_the_tokens_per_step(tmp_path):
    """A random pair with synthetic acceptance 1.0: the chain accepts every draft, so each verify
    step yields steps + 1 tokens and every reply runs to max_tokens."""
    out = tmp_path / "synthetic.json"
    result = batch_sweep.main(["--shape", "tiny", "--device", "cpu", "--steps", "2", "--concurrency", "1",
                               "--synthetic-accept", "1,1", "--num-prompts", "2", "--prompt-len", "8", "--repeats", "3",
                               "--max-tokens", "16", "--rounds", "1", "--out", str(out)])
    plain, chain, off = result["rows"]
    assert plain["tokens_per_step"] == off["tokens_per_step"] == 1.0 and plain["x_plain_throughput"] == 1.0
    assert chain["tokens_per_step"] == 3.0 and chain["output_tokens"] == 2 * 16  # after the first, 5 steps of 3
    assert all(set(r["host_ms_per_step"]) == {"admit", "step", "apply", "flush"} for r in result["rows"])
    assert all(r["host_ms_per_step"]["step"] > 0 for r in result["rows"])
    assert json.loads(out.read_text())["synthetic_acceptance"] == [1.0, 1.0]
    for r in result["rows"]:   # --repeats 3: each row is the median of its three runs
        assert len(r["throughput_runs"]) == 3 and r["throughput"] == sorted(r["throughput_runs"])[1]
    assert "SYNTHETIC" in out.with_suffix(".md").read_text()
    assert json.loads((tmp_path / "manifest.json").read_text())["claim"].startswith("Speculative decoding (random tiny")


def test_bad_flags_name_what_is_wrong(tmp_path, capsys):
    models = h.models()
    for argv, message in ((["--model", str(models.target)], "--model needs --draft"),
                          (["--model", str(models.target), "--draft", str(models.draft), "--synthetic-accept", "1"],
                           "--synthetic-accept is for the random pair"),
                          (["--steps", "0,2"], "--steps: chain step counts, each >= 1")):
        with pytest.raises(SystemExit):
            batch_sweep.main(argv + ["--out", str(tmp_path / "x.json")])
        assert message in capsys.readouterr().err


def test_the_table_drafts_only_past_the_noise_margin():
    """A chain goes into the table where it beats the speculative engine at 0 steps (what the
    table would run instead) by more than --min-gain, whatever plain decoding measured."""
    rows = [dict(setting=s, steps=k, concurrency=c, throughput=t) for s, k, c, t in [
        ("plain", 0, 1, 100.0), ("chain 1", 1, 1, 130.0), ("chain 2", 2, 1, 125.0), ("0 steps", 0, 1, 98.0),
        ("plain", 0, 8, 100.0), ("chain 1", 1, 8, 102.0), ("chain 2", 2, 8, 90.0), ("0 steps", 0, 8, 100.0),
        ("plain", 0, 16, 100.0), ("chain 1", 1, 16, 80.0), ("0 steps", 0, 16, 85.0),
        ("plain", 0, 32, 100.0), ("chain 1", 1, 32, 90.0), ("0 steps", 0, 32, 60.0)]]
    assert batch_sweep.choose_table(rows, [1, 8, 16, 32], min_gain=0.03) == {"1": 1, "8": 0, "16": 0, "32": 1}
    assert batch_sweep.choose_table(rows, [1, 8, 16, 32]) == {"1": 1, "8": 1, "16": 0, "32": 1}


def test_plain_engine_shares_the_weights_but_not_the_kv_cache():
    """The sweep's plain and speculative decoders are alive together: each needs its own cache
    (a second setup_cache would replace the first's under its captured CUDA graphs)."""
    from benchmarks.shapes import random_pair
    from engine.decoder import BatchDecoder, SpecConfig
    from models.layers import own_cache_copy
    target, drafter, _ = random_pair("tiny", "cpu", "float32")
    plain = BatchDecoder(own_cache_copy(target), None, None, 2, 64)
    spec = BatchDecoder(target, drafter, SpecConfig(2), 2, 64)
    assert [p.data_ptr() for p in plain.target.parameters()] == [p.data_ptr() for p in target.parameters()]
    caches = [(a.self_attn.kv_cache.k, b.self_attn.kv_cache.k) for a, b in zip(plain.target.layers, spec.target.layers)]
    assert all(a.data_ptr() != b.data_ptr() for a, b in caches)
