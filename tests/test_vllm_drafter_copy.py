"""The copy of a drafter made for vLLM (models.eagle3_checkpoint.vllm_drafter_dir): aux ids + 1
(vLLM reads them as inputs of layers), no d2t/t2d for a full draft vocabulary, weights linked."""
import json

import torch
from safetensors.torch import load_file

from models.eagle3 import Eagle3Config, Eagle3Drafter
from models.eagle3_checkpoint import load_drafter, save_drafter, vllm_drafter_dir


def _drafter(draft_vocab: int) -> Eagle3Drafter:
    torch.manual_seed(0)
    cfg = Eagle3Config(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, vocab_size=10, draft_vocab_size=draft_vocab, target_hidden_size=32,
                       aux_layer_ids=[1, 3, 4])
    return Eagle3Drafter(cfg)


def test_vllm_copy_shifts_aux_ids_and_links_weights_with_a_draft_vocabulary(tmp_path):
    save_drafter(_drafter(4), tmp_path / "d")
    out = vllm_drafter_dir(tmp_path / "d", tmp_path / "v")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # inputs of layers
    assert cfg["specserve"] == {**cfg["specserve"], "trained_aux_layer_outputs": [1, 3, 4], "serving_engine": "vllm"}
    assert (out / "model.safetensors").resolve() == (tmp_path / "d" / "model.safetensors").resolve()


def test_vllm_copy_drops_d2t_t2d_for_a_full_draft_vocabulary_and_still_loads_natively(tmp_path):
    d = _drafter(10)
    save_drafter(d, tmp_path / "d", dtype=torch.float32)
    out = vllm_drafter_dir(tmp_path / "d", tmp_path / "v")
    assert not {"d2t", "t2d"} & set(load_file(str(out / "model.safetensors")))
    again = load_drafter(out, d.embed_tokens.weight.data)
    assert again.config.aux_layer_ids == [1, 3, 4]
    assert torch.equal(again.fc.weight, d.fc.weight)
