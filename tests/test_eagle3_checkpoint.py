"""EAGLE-3 checkpoints round-trip exactly and use SGLang's config keys and weight names."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from models.eagle3 import Eagle3Config, Eagle3Drafter
from models.eagle3_checkpoint import WEIGHT_NAMES, load_drafter, save_drafter

SGLANG_WEIGHTS = {
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight", "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
}


def _drafter(seed=0):
    torch.manual_seed(seed)
    cfg = Eagle3Config(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, vocab_size=10, draft_vocab_size=4, target_hidden_size=48,
                       aux_layer_ids=[1, 3, 4])
    d = Eagle3Drafter(cfg)
    for p in d.parameters():
        p.data.normal_()
    used = torch.tensor([1, 4, 5, 9])  # hand-made draft vocabulary
    d.d2t.copy_(used - torch.arange(4))
    d.t2d.zero_()
    d.t2d[used] = True
    return d


def test_round_trip_is_exact(tmp_path):
    d = _drafter()
    save_drafter(d, tmp_path, dtype=torch.float32)
    loaded = load_drafter(tmp_path, d.embed_tokens.weight.data)
    a, b = d.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "float32"   # what is stored


def test_format_matches_sglang(tmp_path):
    d = _drafter()
    save_drafter(d, tmp_path)
    assert set(load_file(str(tmp_path / "model.safetensors"))) == SGLANG_WEIGHTS == WEIGHT_NAMES
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 1
    assert cfg["vocab_size"] == 10 and cfg["draft_vocab_size"] == 4 and cfg["target_hidden_size"] == 48
    assert cfg["tie_word_embeddings"] is False
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True}
    assert cfg["specserve"]["trained_aux_layer_outputs"] == [1, 3, 4]


def test_vllm_export_shifts_aux_ids(tmp_path):
    save_drafter(_drafter(), tmp_path, serving_engine="vllm")
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    loaded = load_drafter(tmp_path, None)
    assert loaded.config.aux_layer_ids == [1, 3, 4]  # what training captured, whatever the serving ids


def test_d2t_t2d_hand_made_example(tmp_path):
    d = _drafter()
    save_drafter(d, tmp_path)
    w = load_file(str(tmp_path / "model.safetensors"))
    assert w["d2t"].dtype == torch.int64 and w["d2t"].tolist() == [1, 3, 3, 6]
    assert w["t2d"].dtype == torch.bool
    assert w["t2d"].nonzero().flatten().tolist() == [1, 4, 5, 9]
    assert d.draft_to_target(torch.arange(4)).tolist() == [1, 4, 5, 9]


def test_embedding_is_shared_not_saved(tmp_path):
    d = _drafter()
    save_drafter(d, tmp_path)
    emb = torch.randn(10, 32)
    loaded = load_drafter(tmp_path, emb)
    assert loaded.embed_tokens.weight.data_ptr() == emb.data_ptr()
    assert not loaded.embed_tokens.weight.requires_grad


def test_full_draft_vocabulary_carries_no_d2t_t2d(tmp_path):
    """vLLM refuses d2t when the draft vocabulary is the target's ("no module or parameter named
    'draft_id_to_target_id'"); SGLang and our loader need none then, and the drafter is the same."""
    torch.manual_seed(0)
    cfg = Eagle3Config(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, vocab_size=10, draft_vocab_size=10, target_hidden_size=32, aux_layer_ids=[1, 3, 4])
    d = Eagle3Drafter(cfg)
    d.t2d.fill_(True)  # the identity map a full vocabulary has
    save_drafter(d, tmp_path, dtype=torch.float32)
    assert {"d2t", "t2d"}.isdisjoint(load_file(str(tmp_path / "model.safetensors")))
    loaded = load_drafter(tmp_path, d.embed_tokens.weight.data)
    for k, v in d.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    assert json.loads((tmp_path / "config.json").read_text())["specserve"]["capture_engine"] == "native"


def test_a_shared_head_drafter_stores_no_head_and_borrows_the_targets(tmp_path):
    """No draft_vocab_size in the config (SGLang then loads the target's head) and no lm_head, d2t
    or t2d in the weights (vLLM then shares the target's); loaded, its head is the target's tensor."""
    torch.manual_seed(0)
    cfg = Eagle3Config(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, vocab_size=10, draft_vocab_size=10, target_hidden_size=48,
                       aux_layer_ids=[1, 3, 4], shared_head=True)
    d = Eagle3Drafter(cfg)
    for p in d.parameters():
        p.data.normal_()
    d.t2d.fill_(True)   # the whole vocabulary, each id its own (d2t zero)
    save_drafter(d, tmp_path, dtype=torch.float32)
    assert "draft_vocab_size" not in json.loads((tmp_path / "config.json").read_text())
    assert set(load_file(str(tmp_path / "model.safetensors"))) == WEIGHT_NAMES - {"lm_head.weight", "d2t", "t2d"}
    head = torch.randn(10, 32)
    loaded = load_drafter(tmp_path, d.embed_tokens.weight.data, lm_head=head)
    assert loaded.config.shared_head and loaded.config.draft_vocab_size == 10
    assert loaded.lm_head.weight.data_ptr() == head.data_ptr() and not loaded.lm_head.weight.requires_grad
    for k, v in d.state_dict().items():
        if k != "lm_head.weight":
            assert torch.equal(v, loaded.state_dict()[k]), k


def test_a_head_that_one_engine_would_use_and_the_other_not_is_refused(tmp_path):
    """A config without draft_vocab_size beside a stored head (vLLM uses it, SGLang the target's),
    and a config with draft_vocab_size without one (SGLang would serve a random head)."""
    save_drafter(_drafter(), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "draft_vocab_size"}))
    with pytest.raises(ValueError, match="SGLang would borrow the target's lm_head, but the checkpoint holds one"):
        load_drafter(tmp_path, None)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    weights = load_file(str(tmp_path / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if k != "lm_head.weight"}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="SGLang would serve a random head: remove draft_vocab_size"):
        load_drafter(tmp_path, None)
