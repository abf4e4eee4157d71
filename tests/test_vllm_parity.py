"""benchmarks/vllm_parity without vLLM: the comparison on hand-made side results, the vLLM copy
of a drafter (aux ids + 1; no d2t/t2d for a full draft vocabulary), and the driver end to end
on the shipped pair with the vLLM side replaced by a second native run."""
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from benchmarks import vllm_parity
from benchmarks.vllm_parity_compare import compare, first_difference, markdown
from benchmarks.vllm_parity_native import run_native
from models.eagle3 import Eagle3Config, Eagle3Drafter
from models.eagle3_checkpoint import load_drafter, save_drafter

ROOT = Path(__file__).resolve().parent.parent


def _out(tokens: list[int], text: str, verify: int, accepted: int, proposed: int = 0) -> dict:
    return {"token_ids": tokens, "text": text, "finish_reason": "length", "verify_steps": verify,
            "proposed_draft_tokens": proposed or 3 * verify, "accepted_draft_tokens": accepted}


def _side(engine: str, outputs: list[dict], **extra) -> dict:
    return {"engine": engine, "version": "x", "load_s": 1.0, "generate_s": 2.0, "outputs": outputs, **extra}


VLLM = _side("vllm", [_out([5, 6, 7, 8], "abcd", 2, 3), _out([1, 2, 3, 4], "wxyz", 2, 2)],
             counters={"vllm:spec_decode_num_drafts": 4, "vllm:spec_decode_num_draft_tokens": 12,
                       "vllm:spec_decode_num_accepted_tokens": 5})
NATIVE = _side("native", [_out([5, 6, 7, 8], "abcd", 2, 3), _out([1, 2, 9, 4, 0], "wxQzz", 3, 2)])


def test_first_difference_names_the_first_mismatch_or_the_shorter_length():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference("abc", "ab") == 2


def test_comparison_counts_equal_texts_and_locates_each_difference():
    c = compare(VLLM, NATIVE)
    assert c["prompts"] == 2 and c["equal_text_fraction"] == c["equal_tokens_fraction"] == 0.5
    same, diff = c["per_prompt"]
    assert same["equal_text"] and same["first_diff_token"] is None
    assert not diff["equal_text"] and diff["first_diff_token"] == 2 and diff["first_diff_char"] == 2
    assert diff["vllm_accept_length"] == 2.0 and diff["native_accept_length"] == 5 / 3


def test_both_accept_length_conventions_per_engine():
    vllm, native = compare(VLLM, NATIVE)["engines"]
    assert vllm["accept_length"] == 8 / 4                  # completion tokens / verify steps
    assert vllm["mean_acceptance_length"] == 1 + 5 / 4     # vLLM's 1 + accepted / drafts
    assert vllm["metrics_mean_acceptance_length"] == 1 + 5 / 4
    assert vllm["accept_rate"] == 5 / 12 and vllm["tok_per_s"] == 8 / 2.0
    assert native["accept_length"] == 9 / 5 and "metrics_mean_acceptance_length" not in native


def test_markdown_starts_with_the_command_and_shows_each_difference():
    page = markdown(compare(VLLM, NATIVE), VLLM, NATIVE, "python -m benchmarks.vllm_parity --x")
    assert page.index("python -m benchmarks.vllm_parity --x") < page.index("Equal texts: 1/2 (50%)")
    assert "Prompt 1, from character 2 (token 2)" in page and "'wxyz'" in page and "'wxQzz'" in page


def _drafter(draft_vocab: int) -> Eagle3Drafter:
    torch.manual_seed(0)
    cfg = Eagle3Config(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, vocab_size=10, draft_vocab_size=draft_vocab, target_hidden_size=32,
                       aux_layer_ids=[1, 3, 4])
    return Eagle3Drafter(cfg)


def test_vllm_copy_shifts_aux_ids_and_links_weights_with_a_draft_vocabulary(tmp_path):
    save_drafter(_drafter(4), tmp_path / "d")
    out = vllm_parity.vllm_drafter_dir(tmp_path / "d", tmp_path / "v")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # inputs of layers
    assert cfg["specserve"] == {**cfg["specserve"], "trained_aux_layer_outputs": [1, 3, 4], "serving_engine": "vllm"}
    assert (out / "model.safetensors").resolve() == (tmp_path / "d" / "model.safetensors").resolve()


def test_vllm_copy_drops_d2t_t2d_for_a_full_draft_vocabulary_and_still_loads_natively(tmp_path):
    d = _drafter(10)
    save_drafter(d, tmp_path / "d", dtype=torch.float32)
    out = vllm_parity.vllm_drafter_dir(tmp_path / "d", tmp_path / "v")
    assert not {"d2t", "t2d"} & set(load_file(str(out / "model.safetensors")))
    again = load_drafter(out, d.embed_tokens.weight.data)
    assert again.config.aux_layer_ids == [1, 3, 4]
    assert torch.equal(again.fc.weight, d.fc.weight)


def test_native_side_result_has_the_compared_shape():
    side = run_native(str(ROOT / "shipped/target"), str(ROOT / "shipped/drafter"), [[1, 5, 9], [1, 7]],
                      steps=3, max_tokens=8)
    assert [len(o["token_ids"]) for o in side["outputs"]] == [8, 8]
    assert all(0 < o["verify_steps"] < 8 and o["text"] for o in side["outputs"])
    assert compare(side, side)["equal_text_fraction"] == 1.0


def test_driver_writes_json_and_markdown(tmp_path, monkeypatch):
    seen = {}

    def fake_vllm(request, work, python):
        seen.update(request, draft_cfg=json.loads((Path(request["draft"]) / "config.json").read_text()))
        return {**run_native(str(ROOT / "shipped/target"), str(ROOT / "shipped/drafter"), request["prompts"],
                             steps=request["num_speculative_tokens"], max_tokens=request["max_tokens"]),
                "engine": "vllm"}

    monkeypatch.setattr(vllm_parity, "run_vllm", fake_vllm)
    report = vllm_parity.main(["--target", str(ROOT / "shipped/target"), "--draft", str(ROOT / "shipped/drafter"),
                               "--num-prompts", "2", "--max-tokens", "8", "--name", "t", "--out-dir", str(tmp_path)])
    assert seen["draft_cfg"]["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 16, 29]
    assert len(seen["prompts"]) == 2 and report["equal_text_fraction"] == 1.0
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["comparison"] == report and saved["settings"]["num_speculative_tokens"] == 3
    assert (tmp_path / "t.md").read_text().startswith("# vLLM vs native")
