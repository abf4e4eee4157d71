"""The aux-layer conventions (models/aux_layers.py) agree with the engines' own sources: SGLang
0.5.23 in .venv (which models take the DeepSeek rule, which have no EAGLE-3, ascending capture)
and vLLM (its default ids, its sorting) where .venv-vllm holds it; ids that neither engine can
feed in training order are sorted in training and export, refused by serving_ids_for."""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch

from models.aux_layers import (
    SGLANG_DEEPSEEK_RULE,
    SGLANG_NO_EAGLE3,
    captured_layer_outputs,
    default_aux_layer_ids,
    serving_ids_for,
    sglang_rule,
)

ROOT = Path(__file__).resolve().parents[1]
VLLM = next(ROOT.glob(".venv-vllm/lib/python3*/site-packages/vllm"), None)


def sglang_models() -> Path:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None, "sglang 0.5.23 (--no-deps) must be installed: make test installs it"
    return Path(spec.origin).parent / "srt" / "models"


def classes(tree) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}


def method_source(src: str, cls: ast.ClassDef, name: str) -> str | None:
    fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    return None if fn is None else ast.get_source_segment(src, fn)


def test_deepseek_rule_list_is_sglangs():
    """Every class whose set_eagle3_layers_to_capture adds +1 only for a first id of 1, their
    subclasses, and KimiK25 (which hands the call to its DeepseekV3ForCausalLM)."""
    own, bases, delegates = set(), {}, {}
    for f in sglang_models().glob("*.py"):
        src = f.read_text()
        for name, c in classes(ast.parse(src)).items():
            bases[name] = [b.id for b in c.bases if isinstance(b, ast.Name)]
            m = method_source(src, c, "set_eagle3_layers_to_capture")
            if m and "layer_ids[0] == 1" in m:
                own.add(name)
            elif m and "self.language_model.set_eagle3_layers_to_capture" in m:
                delegates[name] = src
    rule = set(own)
    while True:  # subclasses inherit the rule
        more = {n for n, bs in bases.items() if n not in rule and any(b in rule for b in bs)}
        if not more:
            break
        rule |= more
    rule |= {n for n, src in delegates.items() if "self.language_model = DeepseekV3ForCausalLM(" in src}
    rule = {n for n in rule if not n.endswith(("NextN", "Eagle"))}  # MTP/draft heads, not targets
    assert set(SGLANG_DEEPSEEK_RULE) == rule
    assert {"DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "MistralLarge3ForCausalLM", "Glm4MoeLiteForCausalLM",
            "KimiK25ForConditionalGeneration"} <= rule


def test_kimi_vl_has_no_eagle3_in_sglang():
    src = (sglang_models() / "kimi_vl.py").read_text()
    assert "set_eagle3_layers_to_capture" not in src and "KimiVLForConditionalGeneration" in src
    assert SGLANG_NO_EAGLE3 == ("KimiVLForConditionalGeneration",)
    assert "KimiVLForConditionalGeneration" not in SGLANG_DEEPSEEK_RULE


def test_sglang_captures_in_layer_order():
    """deepseek_v2 and llama test `i in layers_to_capture` while walking the layers: ascending."""
    for f in ("deepseek_v2.py", "llama.py"):
        src = (sglang_models() / f).read_text()
        assert "in self.layers_to_capture" in src and "for i in range(" in src


def test_rules_for_a_61_layer_kimi_target():
    for ids in ([1, 29, 57], [2, 30, 58]):
        assert captured_layer_outputs("sglang-deepseek", ids, 61) == [1, 29, 57]
    assert captured_layer_outputs("sglang-llama", [2, 30, 58], 61) == [2, 30, 58]
    assert captured_layer_outputs("vllm", [2, 30, 58], 61) == [1, 29, 57]
    assert sglang_rule(["KimiK25ForConditionalGeneration"]) == "sglang-deepseek"
    assert sglang_rule(["KimiVLForConditionalGeneration"]) == "sglang-llama"


@pytest.mark.parametrize("layers", [8, 30, 32, 61])
def test_no_ids_every_engine_feeds_outputs_1_mid_minus4(layers):
    """vLLM and SGLang default to inputs of (2, L//2, L-3): outputs of (1, L//2-1, L-4), training's default."""
    want = [1, layers // 2 - 1, layers - 4]
    assert default_aux_layer_ids(layers) == want
    for e in ("sglang-llama", "sglang-deepseek", "vllm"):
        assert captured_layer_outputs(e, None, layers) == want


@pytest.mark.skipif(VLLM is None, reason="vLLM's source is in .venv-vllm (make vllm-venv)")
def test_vllm_source_defaults_and_sorts():
    src = (VLLM / "model_executor" / "models" / "interfaces.py").read_text()
    assert "return (2, num_layers // 2, num_layers - 3)" in src       # input-of-layer ids
    assert "tuple(sorted(set(layers)))" in src                          # ascending, once each


def test_engines_feed_ascending_whatever_the_configured_order():
    assert captured_layer_outputs("vllm", [30, 2, 58], 61) == [1, 29, 57]
    assert captured_layer_outputs("sglang-llama", [29, 1, 57], 61) == [1, 29, 57]
    with pytest.raises(ValueError, match="not ascending"):
        serving_ids_for("vllm", [29, 1, 57])


def test_export_puts_fc_blocks_in_ascending_order(tmp_path):
    """A drafter trained on [3, 1, 2] computes the same once saved as [1, 2, 3] with fc reordered."""
    from models.eagle3 import Eagle3Config, Eagle3Drafter
    from models.eagle3_checkpoint import load_drafter, save_drafter
    torch.manual_seed(0)
    cfg = Eagle3Config(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, vocab_size=64, draft_vocab_size=16, target_hidden_size=32, aux_layer_ids=[3, 1, 2])
    d = Eagle3Drafter(cfg)
    save_drafter(d, tmp_path / "d", dtype=torch.float32)
    back = load_drafter(tmp_path / "d", d.embed_tokens.weight.detach())
    assert back.config.aux_layer_ids == [1, 2, 3]
    h = {i: torch.randn(2, 5, 32) for i in (1, 2, 3)}
    trained_order = d.fc(torch.cat([h[3], h[1], h[2]], -1))
    ascending = back.fc(torch.cat([h[1], h[2], h[3]], -1))
    torch.testing.assert_close(ascending, trained_order)
