"""`python -m benchmarks nccl`: a large shape through vLLM at tensor parallel N. The dry run prints every
point's vLLM arguments and environment, which come from a generated profile through our own
vllm_engine_args; the shapes, drafter configs and acceptance curves are what the GPU run serves; on
vLLM's CPU build the tiny shape runs for real (plain and EAGLE-3, acceptance verified for real) and
writes its record and a profile our launcher resolves."""
from __future__ import annotations

import json
import re

import pytest

from benchmarks import nccl_sweep
from benchmarks import tensor_parallel as shapes
from benchmarks.server_proc import VLLM_PYTHON
from launch.engine_args import vllm_engine_args
from launch.profiles import resolve


def test_nccl_points():
    combos = nccl_sweep.all_combos()
    assert len(combos) == 2 + 3 * 2 * 2 + 3 * 2 and len({json.dumps(e, sort_keys=True) for _, e, _ in combos}) == 20
    assert combos[0] == ("vllm default", {}, True)  # vLLM's custom all-reduce, as it ships
    for label, env, custom in combos[1:]:            # NCCL alone: no custom all-reduce, no symmetric memory
        assert not custom and env["VLLM_ALLREDUCE_USE_SYMM_MEM"] == "0", label
    assert sum(e.get("NCCL_P2P_DISABLE") == "1" for _, e, _ in combos) == 6


def test_curves_give_the_stated_accept_lengths():
    c = shapes.CURVES
    assert all(len(v) == 7 and v == sorted(v, reverse=True) for v in c.values())  # vLLM: non-increasing
    assert shapes.accept_length(c["8b"], 3) == pytest.approx(3.29, abs=0.01)     # our 8B record
    assert shapes.accept_length(c["8b"], 7) == pytest.approx(4.42, abs=0.01)
    assert shapes.accept_length(c["reference"], 2) == pytest.approx(2.1)          # the reference team's
    assert 3.2 <= shapes.accept_length(c["kimi-k2"], 3) <= 3.5                    # the public Kimi-K2 drafter


def test_shapes_depth_and_drafter_configs(tmp_path):
    assert shapes.fit_layers("70b", 1, 80) < 80 == shapes.fit_layers("70b", 8, 80)
    assert shapes.fit_layers("8b", 1, 80) == 32
    target, drafter = shapes.write_pair("70b", 29, tmp_path)
    t, d = (json.loads((p / "config.json").read_text()) for p in (target, drafter))
    assert t["num_hidden_layers"] == 29 and t["hidden_size"] == d["hidden_size"] == d["target_hidden_size"] == 8192
    assert d["architectures"] == ["LlamaForCausalLMEagle3"] and d["num_hidden_layers"] == 1
    assert d["draft_vocab_size"] == 32000 and d["vocab_size"] == t["vocab_size"]
    ids = d["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert ids == [2, 14, 26] and d["eagle_config"]["use_aux_hidden_state"]  # vLLM: inputs of layers, distinct
    _, ds = shapes.write_pair("deepseek", 4, tmp_path / "ds")
    dt = json.loads((tmp_path / "ds" / "target" / "config.json").read_text())
    assert dt["first_k_dense_replace"] == 4 and dt["kv_lora_rank"] == 512  # MLA, dense MLPs
    assert json.loads((ds / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]


def _points(out: str) -> list[dict]:
    found = re.findall(r"== (.+?): steps (\d+).*\n   env (.+)\n   vLLM (.+)", out)
    return [{"key": k, "steps": int(s), "env": json.loads(e), "kw": json.loads(v)} for k, s, e, v in found]


def test_dry_run_prints_every_argument(tmp_path, capsys):
    nccl_sweep.main(["--dry-run", "--tp", "2", "--shape", "70b", "--accept", "reference", "--steps", "0,3",
                     "--only", "vllm default,LL/Ring/P2P SYS", "--out-dir", str(tmp_path)])
    points = _points(capsys.readouterr().out)
    assert [p["key"] for p in points] == ["vllm default", "LL/Ring/P2P SYS", "steps 0", "steps 3"]
    for p in points:
        kw, env = p["kw"], p["env"]
        assert kw["tensor_parallel_size"] == 2 and kw["load_format"] == "dummy" and kw["dtype"] == "bfloat16"
        assert env["NCCL_NVLS_ENABLE"] == "0" and env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
        cc = kw["compilation_config"]
        assert cc["mode"] == 0 and cc["cudagraph_mode"] == "FULL_DECODE_ONLY"
        conc = (1, 2, 8, 32) if p["key"].startswith("steps") else (1, 8)  # --concurrency, --nccl-concurrency
        assert cc["cudagraph_capture_sizes"] == sorted({c * (p["steps"] + 1) for c in conc})
        if p["steps"]:
            spec = kw["speculative_config"]
            assert spec["method"] == "eagle3" and spec["num_speculative_tokens"] == p["steps"]
            assert spec["rejection_sample_method"] == "synthetic"
            assert spec["synthetic_acceptance_rates"] == shapes.CURVES["reference"][:p["steps"]]
        else:
            assert "speculative_config" not in kw
    reference = points[1]
    assert {k: reference["env"][k] for k in ("NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL")} == \
        {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS"}
    assert reference["kw"]["disable_custom_all_reduce"] and "disable_custom_all_reduce" not in points[0]["kw"]
    assert not (tmp_path / "tp2-70b.json").exists()


def test_tp1_skips_the_nccl_sweep(tmp_path, capsys):
    nccl_sweep.main(["--dry-run", "--shape", "8b", "--steps", "0,1", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "nothing for the NCCL sweep" in out and [p["key"] for p in _points(out)] == ["steps 0", "steps 1"]


def test_written_profile_serves_the_steps_table(tmp_path):
    args = nccl_sweep.main(["--dry-run", "--shape", "8b", "--steps", "0", "--out-dir", str(tmp_path)])
    pair = (tmp_path / "tp1-8b-models" / "target", tmp_path / "tp1-8b-models" / "drafter")
    ns = type("A", (), {"device": "cuda", "tp": 1, "shape": "8b", "max_model_len": 1024, "concurrency": [1, 32],
                        "gpu_memory_utilization": 0.9})
    path = tmp_path / "p.toml"
    path.write_text(nccl_sweep.profile_text(ns, pair, {"1": 3, "8": 2, "32": 0}, {"NCCL_PROTO": "LL"}, False, "h"))
    launch = resolve(str(path), environ={})
    kw = vllm_engine_args(launch.profile)
    assert kw["speculative_config"]["num_speculative_tokens"] == 3
    assert kw["speculative_config"]["num_speculative_tokens_per_batch_size"] == [(1, 1, 3), (2, 8, 2), (9, 32, 0)]
    assert launch.env["NCCL_PROTO"] == "LL" and kw["disable_custom_all_reduce"] and args["layers"] == 32


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(600)
@pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason="no .venv-vllm (make vllm-venv)")
def test_cpu_vllm_runs_both_sweeps_at_tp2(tmp_path):
    """Two vLLM starts at TP 2: one NCCL point (plain), then EAGLE-3 with 2 steps at the winner's settings."""
    r = nccl_sweep.main(["--tp", "2", "--device", "cpu", "--shape", "tiny", "--accept", "none",
                         "--only", "LL/Ring/P2P SYS", "--nccl-steps", "0", "--nccl-concurrency", "1", "--steps", "2",
                         "--concurrency", "1,2", "--max-tokens", "16", "--prompt-len", "16", "--rounds", "1",
                         "--gpu-memory-utilization", "0.2", "--max-model-len", "256", "--python", str(VLLM_PYTHON),
                         "--claim", "runs", "--out-dir", str(tmp_path)])
    saved = json.loads((tmp_path / "tp2-tiny.json").read_text())
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["claim"] == "runs" and manifest["vllm"] == "0.32.0" and manifest["mode"] == "enforce_eager"
    assert [(p["phase"], p["key"]) for p in saved["points"]] == [("nccl", "LL/Ring/P2P SYS"), ("steps", "steps 2")]
    for p in saved["points"]:
        assert "error" not in p, p.get("error")
        assert p["kwargs"]["tensor_parallel_size"] == 2 and p["kwargs"]["disable_custom_all_reduce"]
        assert all(row["tok_s"] > 0 and row["step_ms"] > 0 for row in p["rows"])
    assert saved["points"][1]["rows"][0]["accept_length"] >= 1   # EAGLE-3 drafted and verified
    assert saved["points"][1]["env"]["NCCL_PROTO"] == "LL"       # the step sweep ran with the winner
    assert r["nccl_winner"] == "LL/Ring/P2P SYS" and r["steps_by_batch"] == {"1": 2, "2": 2}
    assert (tmp_path / "tp2-tiny.png").is_file()
    assert "| nccl | LL/Ring/P2P SYS |" in (tmp_path / "tp2-tiny.md").read_text()
    launch = resolve(r["profile"], environ={})
    kw = vllm_engine_args(launch.profile)
    assert kw["load_format"] == "dummy" and kw["tensor_parallel_size"] == 2 and kw["disable_custom_all_reduce"]
    assert launch.env["NCCL_PROTO"] == "LL" and kw["speculative_config"]["num_speculative_tokens"] == 2
