"""launch/serve.sh and the `specserve` entry point: --dry-run shows the effective profile, the
environment and the exact SGLang arguments; a drafter that does not fit its target stops the
launch (from config.json alone, so SGLang profiles are checked too); a missing sglang is one
clear error. None of these load weights or start a server."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch import cli
from launch.profiles import PROFILE_DIR, PROJECT_ROOT

SERVE_SH = PROJECT_ROOT / "launch" / "serve.sh"


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SPECSERVE_")) and k != "PYTHON"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # serve.sh runs `python`
    env.update(extra)
    return env


@pytest.fixture
def environ_restored():
    saved = dict(os.environ)
    for k in [k for k in os.environ if k.startswith(("NCCL_", "SPECSERVE_"))]:
        del os.environ[k]
    yield os.environ
    os.environ.clear()
    os.environ.update(saved)


def llama_target(path: Path, hidden=64, vocab=512, layers=4, arch="LlamaForCausalLM") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "architectures": [arch], "model_type": "llama", "hidden_size": hidden, "vocab_size": vocab,
        "num_hidden_layers": layers, "intermediate_size": 2 * hidden, "num_attention_heads": 4}))
    return path


def eagle3_drafter(path: Path, hidden=64, vocab=512, trained=(0, 1, 2), serving="sglang-llama",
                   configured=None) -> Path:
    from models.eagle3 import Eagle3Config
    from models.eagle3_checkpoint import config_to_hf
    path.mkdir(parents=True, exist_ok=True)
    cfg = config_to_hf(Eagle3Config(hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=4,
                                    num_key_value_heads=4, head_dim=hidden // 4, vocab_size=vocab,
                                    draft_vocab_size=min(vocab, 32000), target_hidden_size=hidden,
                                    aux_layer_ids=list(trained)), serving)
    if configured is not None:
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(configured)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_serve_sh_dry_run_reference_shows_nccl_and_sglang_arguments():
    r = subprocess.run([str(SERVE_SH), "--dry-run", "--profile", "reference"], env=clean_env(),
                       capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    for s in ("NCCL_PROTO=LL", "NCCL_ALGO=Ring", "NCCL_P2P_LEVEL=SYS", "--speculative-algorithm EAGLE3",
              "--speculative-num-steps 2", "--speculative-eagle-topk 1", "--speculative-num-draft-tokens 3",
              "--tp-size 8", "--cuda-graph-max-bs-decode"):
        assert s in r.stdout, s
    assert "--cuda-graph-max-bs " not in r.stdout


def test_serve_sh_is_a_thin_exec_shell():
    text = SERVE_SH.read_text()
    assert os.access(SERVE_SH, os.X_OK)
    assert 'exec "${PYTHON:-python}" -m launch.cli "$@"' in text
    assert len([line for line in text.splitlines() if line.strip() and not line.startswith("#")]) <= 5


def test_follower_node_runs_sglang_schedulers_only(capsys, environ_restored):
    environ_restored.update(NODE_RANK="1", DIST_INIT_ADDR="node0:50000")
    rc, out, _ = run_cli(capsys, "--dry-run", "--profile", "reference-2node")
    assert rc == 0
    assert "-m sglang.launch_server" in out and "--node-rank 1 --dist-init-addr node0:50000" in out


def test_no_profile_and_no_gpu_picks_cpu_default(capsys, environ_restored, tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the default is gpu-native")
    t, d = llama_target(tmp_path / "t"), eagle3_drafter(tmp_path / "d")
    rc, out, _ = run_cli(capsys, "--dry-run", "--model", str(t), "--draft", str(d), "--steps", "2")
    assert rc == 0
    assert "profile cpu-default" in out and "no GPU" in out
    assert "EAGLE3 steps 2, topk 1, draft tokens 3" in out
    assert "pair check: drafter fits target: hidden 64, vocab 512" in out


@pytest.mark.parametrize("drafter,msg", [
    (dict(hidden=128), ["target_hidden_size 128 != target hidden_size 64"]),
    (dict(vocab=1000), ["vocab_size 1000 != target vocab_size 512"]),
    (dict(trained=(1, 2, 9)), ["[1, 2, 9]", "4-layer target"]),
])
def test_a_drafter_that_does_not_fit_stops_the_launch(capsys, environ_restored, tmp_path, drafter, msg):
    t, d = llama_target(tmp_path / "t"), eagle3_drafter(tmp_path / "d", **drafter)
    rc, out, err = run_cli(capsys, "--profile", "cpu-default", "--steps", "3", "--model", str(t), "--draft", str(d))
    assert rc == 2
    assert str(d / "config.json") in err and str(t / "config.json") in err
    for m in msg:
        assert m in err, err


def test_sglang_profile_checks_the_pair_from_configs(capsys, environ_restored, tmp_path):
    t = llama_target(tmp_path / "t")
    rc, out, _ = run_cli(capsys, "--dry-run", "--profile", "reference", "--model", str(t),
                         "--draft", str(eagle3_drafter(tmp_path / "d")))
    assert rc == 0 and "SGLang (sglang-llama) captures outputs of layers [0, 1, 2]" in out
    bad = eagle3_drafter(tmp_path / "d2", configured=[1, 2, 3])  # exported for vLLM's convention
    rc, _, err = run_cli(capsys, "--dry-run", "--profile", "reference", "--model", str(t), "--draft", str(bad))
    assert rc == 2
    assert "capture the outputs of layers [1, 2, 3]" in err and "trained on the outputs of layers [0, 1, 2]" in err


def test_kimi_shaped_pair_follows_sglang_deepseek_convention(capsys, environ_restored, tmp_path):
    """Kimi-K2.5 (61 layers, DeepSeek-V3 model code): ids [2, 30, 58] capture outputs 1, 29, 57."""
    t = llama_target(tmp_path / "kimi", hidden=7168, vocab=163840, layers=61, arch="DeepseekV3ForCausalLM")
    d = eagle3_drafter(tmp_path / "d", hidden=7168, vocab=163840, trained=(1, 29, 57), configured=[2, 30, 58])
    rc, out, _ = run_cli(capsys, "--dry-run", "--profile", "reference", "--model", str(t), "--draft", str(d))
    assert rc == 0 and "SGLang (sglang-deepseek) captures outputs of layers [1, 29, 57]" in out
    off = eagle3_drafter(tmp_path / "d3", hidden=7168, vocab=163840, trained=(1, 29, 57), configured=[3, 31, 59])
    rc, _, err = run_cli(capsys, "--dry-run", "--profile", "reference", "--model", str(t), "--draft", str(off))
    assert rc == 2 and "[2, 30, 58]" in err and "[1, 29, 57]" in err


def test_missing_sglang_is_one_clear_error(capsys, environ_restored, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "sglang" else real(n, *a))
    rc, _, err = run_cli(capsys, "--profile", "reference")
    assert rc == 2 and "pip install .[sglang]" in err and "Docker" in err


def test_bad_profile_exits_2_with_the_field(capsys, environ_restored):
    rc, _, err = run_cli(capsys, "--dry-run", "--profile", "reference", "--draft-tokens", "9")
    assert rc == 2 and "specserve: error: --draft-tokens: speculative.draft_tokens" in err


def test_environment_is_exported_and_the_api_key_never_printed(capsys, environ_restored):
    environ_restored["SPECSERVE_API_KEY"] = "s3cret"
    rc, out, _ = run_cli(capsys, "--dry-run", "--profile", "reference")
    assert rc == 0 and os.environ["NCCL_ALGO"] == "Ring"
    assert "api key set" in out and "s3cret" not in out


def test_steps_auto_falls_back_with_a_message(capsys, environ_restored):
    rc, out, _ = run_cli(capsys, "--dry-run", "--profile", "reference", "--steps", "auto")
    assert rc == 0 and "--steps auto" in out and "--speculative-num-steps 2" in out


def sweep_profile(tmp_path: Path) -> Path:
    """The reference profile, naming a sweep file beside it (as a deployment would)."""
    text = (PROFILE_DIR / "reference.toml").read_text().replace("draft_tokens = 3\n",
                                                                  'draft_tokens = 3\nsweep_file = "sweep.json"\n')
    path = tmp_path / "reference.toml"
    path.write_text(text)
    return path


def test_steps_auto_reads_the_sweep_file_the_profile_names(capsys, environ_restored, tmp_path):
    """The step sweep writes a "best" record (and, from several concurrencies, steps_by_batch) to
    the profile's speculative.sweep_file, outside the source tree; --steps auto serves it."""
    prof = str(sweep_profile(tmp_path))
    rc, out, _ = run_cli(capsys, "--dry-run", "--profile", prof, "--steps", "auto")
    assert rc == 0 and "no step sweep at" in out and "--speculative-num-steps 2" in out
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps(
        {"rows": [], "best": {"steps": 3, "topk": 4, "draft_tokens": 8, "tok_s": 101.5, "setting": "3:4:8"}}))
    rc, out, _ = run_cli(capsys, "--dry-run", "--profile", prof, "--steps", "auto")
    assert rc == 0 and "101.5 tok/s" in out
    assert "--speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8" in out
    sweep.write_text(json.dumps({"best": {"steps": 0, "topk": 1, "draft_tokens": 0}}))
    rc, out, _ = run_cli(capsys, "--dry-run", "--profile", prof, "--steps", "auto")
    assert rc == 0 and "speculative  off" in out and "--speculative-algorithm" not in out
    sweep.write_text(json.dumps({"best": {"steps": 3, "topk": 1, "draft_tokens": 4},
                                 "synthetic_acceptance": [0.9, 0.8, 0.7]}))
    rc, out, _ = run_cli(capsys, "--dry-run", "--profile", prof, "--steps", "auto")
    assert rc == 0 and "SYNTHETIC" in out and "--speculative-num-steps 2" in out  # never served
    sweep.write_text(json.dumps({"best": {"steps": 4, "topk": 1, "draft_tokens": 5},
                                 "steps_by_batch": {"1": 4, "4": 2, "16": 0}}))
    rc, out, _ = run_cli(capsys, "--dry-run", "--profile", prof, "--steps", "auto")
    assert rc == 0 and "per batch size <= 1: 4, <= 4: 2, <= 16: 0" in out
    assert "--speculative-num-steps 4" in out and "--speculative-adaptive --speculative-adaptive-config" in out
    adaptive = out.split("--speculative-adaptive-config ")[1].split()[0]
    assert json.loads(Path(adaptive).read_text()) == {
        "1": {"candidate_steps": [4]}, "2": {"candidate_steps": [2]}, "5": {"candidate_steps": [0]}}


def test_every_engine_and_server_setting_is_a_flag_that_beats_the_profile(capsys, environ_restored, tmp_path):
    """The flags are generated from the tables that declare the settings (engine/config.py,
    launch/profiles.py): a setting added there is a flag, and the flag's value wins."""
    from engine.config import NativeConfig
    from launch.profiles import ServerSection, flag_name, table_fields
    flags = {s for action in cli.build_parser()._actions for s in action.option_strings}
    for section, cls in (("native", NativeConfig), ("server", ServerSection)):
        assert {flag_name(f"{section}.{name}") for name in table_fields(cls)} <= flags, section
    t, d = llama_target(tmp_path / "t"), eagle3_drafter(tmp_path / "d")
    rc, out, _ = run_cli(capsys, "--dry-run", "--profile", "cpu-default", "--model", str(t), "--draft", str(d),
                         "--steps", "2", "--max-batch", "3", "--grammar-timeout", "2.5", "--compile", "--port", "9123")
    assert rc == 0, out
    assert "max_batch=3" in out and "grammar_timeout_s=2.5" in out and "compile=True" in out and ":9123" in out
    assert "max_context=4096" in out  # what the flags leave alone stays the profile's
    rc, _, err = run_cli(capsys, "--dry-run", "--profile", "cpu-default", "--max-batch", "0")
    assert rc == 2 and "specserve: error: --max-batch: native.max_batch: must be >= 1, got 0" in err


def test_a_drafter_whose_head_sglang_would_leave_random_is_refused(capsys, environ_restored, tmp_path):
    """draft_vocab_size in the config and no lm_head in the weights: SGLang keeps a random head
    (vLLM would borrow the target's). Dropping the field is what both engines read as borrowing."""
    import torch
    from safetensors.torch import save_file

    t, d = llama_target(tmp_path / "t"), eagle3_drafter(tmp_path / "d")
    save_file({"fc.weight": torch.zeros(64, 192)}, str(d / "model.safetensors"))
    rc, _, err = run_cli(capsys, "--dry-run", "--profile", "reference", "--model", str(t), "--draft", str(d))
    assert rc == 2 and "SGLang would serve a random head: remove draft_vocab_size" in err
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "draft_vocab_size"}))
    rc, out, err = run_cli(capsys, "--dry-run", "--profile", "reference", "--model", str(t), "--draft", str(d))
    assert rc == 0, err
