"""The SGLang reference profiles' start-up checks and dry run, for Kimi-K2.5-shaped configs (no
weights): the dry run prints exactly which layer outputs SGLang will feed the drafter (and what
vLLM would feed), the INT4 compressed-tensors target, and the concurrency cap SGLang applies;
the checks follow SGLang 0.5.23's model code (the DeepSeek rule for Kimi-K2.5 and its family, no
EAGLE-3 for Kimi-VL), recognise MLA drafters, and refuse aux layers SGLang would feed in another
order than training concatenated."""
from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from tests import test_launch_cli as lc
from tests.test_launch_cli import eagle3_drafter, llama_target, run_cli

environ_restored = lc.environ_restored  # the fixture

ROOT = Path(__file__).resolve().parents[1]
INT4 = {"quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "group_size": 32, "symmetric": True, "strategy": "group"}}}}


def kimi_k25_target(path: Path, arch="KimiK25ForConditionalGeneration") -> Path:
    """Kimi-K2.5's config.json shape: the DeepSeek-V3 LM under text_config, INT4 weights."""
    path.mkdir(parents=True, exist_ok=True)
    text = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": 7168,
            "vocab_size": 163840, "num_hidden_layers": 61, "kv_lora_rank": 512}
    (path / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": "kimi_k25",
                                                  "text_config": text, "quantization_config": INT4}))
    return path


def shipped_drafter(path: Path, name: str, **changes) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((ROOT / "drafter" / "configs" / name).read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("profile", ["reference", "reference-2node"])
def test_dry_run_prints_the_layer_outputs_each_engine_feeds_the_kimi_drafter(capsys, environ_restored, tmp_path,
                                                                            profile):
    environ_restored.update(NODE_RANK="0", DIST_INIT_ADDR="node0:50000")
    t = kimi_k25_target(tmp_path / "kimi")
    d = shipped_drafter(tmp_path / "d", "kimi_k2_eagle3.json", specserve={"capture_engine": "sglang-deepseek"})
    rc, out, err = run_cli(capsys, "--dry-run", "--profile", profile, "--model", str(t), "--draft", str(d))
    assert rc == 0, err
    line = next(x for x in out.splitlines() if x.startswith("pair check:"))
    assert "SGLang (sglang-deepseek) captures outputs of layers [1, 29, 57] (vLLM would feed [1, 29, 57])" in line
    assert "target weights int4 compressed-tensors, group 32" in line
    assert "max running requests 48" in out


def test_mla_drafter_serves_on_sglang_not_on_the_native_engine(capsys, environ_restored, tmp_path):
    t = kimi_k25_target(tmp_path / "kimi")
    d = shipped_drafter(tmp_path / "mla", "kimi_k25_eagle3_mla.json", specserve={"capture_engine": "sglang-deepseek"})
    rc, out, err = run_cli(capsys, "--dry-run", "--profile", "reference", "--model", str(t), "--draft", str(d))
    assert rc == 0 and "MLA drafter" in out and "captures outputs of layers [1, 29, 57]" in out, err
    rc, _, err = run_cli(capsys, "--dry-run", "--profile", "cpu-default", "--steps", "2", "--model", str(t),
                         "--draft", str(d))
    assert rc == 2 and "MLA drafter (Eagle3DeepseekV2ForCausalLM)" in err and "native engine" in err


@pytest.mark.parametrize("arch", ["DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "MistralLarge3ForCausalLM",
                                  "Glm4MoeLiteForCausalLM"])
def test_deepseek_family_targets_take_the_deepseek_rule(capsys, environ_restored, tmp_path, arch):
    t = llama_target(tmp_path / "t", hidden=7168, vocab=163840, layers=61, arch=arch)
    d = eagle3_drafter(tmp_path / "d", hidden=7168, vocab=163840, trained=(1, 29, 57), configured=[2, 30, 58])
    rc, out, err = run_cli(capsys, "--dry-run", "--profile", "reference", "--model", str(t), "--draft", str(d))
    assert rc == 0 and "SGLang (sglang-deepseek) captures outputs of layers [1, 29, 57]" in out, err


def test_kimi_vl_has_no_eagle3_on_sglang(capsys, environ_restored, tmp_path):
    t = kimi_k25_target(tmp_path / "vl", arch="KimiVLForConditionalGeneration")
    d = eagle3_drafter(tmp_path / "d", hidden=7168, vocab=163840, trained=(1, 29, 57))
    rc, _, err = run_cli(capsys, "--dry-run", "--profile", "reference", "--model", str(t), "--draft", str(d))
    assert rc == 2 and "no EAGLE-3 for KimiVLForConditionalGeneration" in err


@pytest.mark.parametrize("trained,why", [((29, 1, 57), "ascending layer order"),
                                         ((1, 29, 29), "captures a layer once")])
def test_layers_sglang_cannot_feed_in_training_order_are_refused(capsys, environ_restored, tmp_path, trained, why):
    t = llama_target(tmp_path / "t", hidden=7168, vocab=163840, layers=61, arch="DeepseekV3ForCausalLM")
    d = eagle3_drafter(tmp_path / "d", hidden=7168, vocab=163840, trained=(1, 29, 57), configured=list(trained))
    cfg = json.loads((d / "config.json").read_text())
    cfg["specserve"]["trained_aux_layer_outputs"] = list(trained)  # as an older export recorded it
    (d / "config.json").write_text(json.dumps(cfg))
    rc, _, err = run_cli(capsys, "--dry-run", "--profile", "reference", "--model", str(t), "--draft", str(d))
    assert rc == 2 and why in err, err


def test_max_running_requests_shown_as_sglang_resolves_it(capsys, environ_restored):
    rc, out, _ = run_cli(capsys, "--dry-run", "--profile", "reference", "--no-spec")
    assert rc == 0 and "max running requests unset (SGLang sizes it from KV-cache memory)" in out
    for name in ("reference", "reference-2node"):
        assert "max_running_requests unset: SGLang 0.5.23 makes it 48" in \
            (ROOT / "launch" / "profiles" / f"{name}.toml").read_text()
    # the 48 is SGLang's own: its EAGLE-family hook sets it when the flag is unset
    from sglang.srt.arg_groups import speculative_hook
    src = inspect.getsource(speculative_hook._handle_eagle_family)
    assert "if cfg.max_running_requests is None:" in src and "max_running_requests=48" in src
