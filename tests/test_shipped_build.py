"""The shipped-model build path at a tiny scale: corpus -> tokenizer -> training -> a HF checkpoint
that transformers and models.llama both load with the same logits, with provenance; plus the
size arithmetic that keeps the shipped target and drafter within 20 MB."""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "shipped"))

import build_corpus  # noqa: E402
import train_target  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("shipped")
    corpus_dir = d / "corpus"
    build_corpus.main(["--max-files", "16", "--packages", "", "--vocab-size", "384", "--out-dir", str(corpus_dir),
                       "--data-dir", str(corpus_dir), "--num-heldout-prompts", "20"])
    common = ["--corpus", str(corpus_dir / "corpus.jsonl.gz"), "--out", str(d / "target"),
              "--work-dir", str(d / "work"), "--heldout-prompts", str(corpus_dir / "heldout_prompts.jsonl"),
              "--hidden", "32", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--intermediate", "64",
              "--max-positions", "128", "--batch-size", "4", "--seq-len", "64", "--eval-every", "4",
              "--eval-batches", "1", "--log-every", "4", "--device", "cpu", "--num-samples", "1",
              "--sample-tokens", "6", "--seed", "3"]
    first = train_target.main(common + ["--steps", "8"])
    resumed = train_target.main(common + ["--steps", "12", "--resume"])
    return corpus_dir, d / "target", first, resumed


def test_corpus_splits_are_disjoint_and_prompts_are_chat_messages(built):
    corpus_dir, *_ = built
    recs = [json.loads(line) for line in gzip.open(corpus_dir / "corpus.jsonl.gz", "rt")]
    held = set((corpus_dir / "heldout_modules.txt").read_text().split("\n")[1:]) - {""}
    assert held and {r["module"] for r in recs if r["split"] == "heldout"} == held
    assert not held & {r["module"] for r in recs if r["split"] == "train"}
    for name in ("heldout_prompts.jsonl", "train_prompts.jsonl"):
        rows = [json.loads(line) for line in (corpus_dir / name).read_text().splitlines()]
        assert rows and all(list(r) == ["messages"] and [m["role"] for m in r["messages"]] == ["user"] for r in rows)
    train = set((corpus_dir / "train_prompts.jsonl").read_text().splitlines())
    assert not train & set((corpus_dir / "heldout_prompts.jsonl").read_text().splitlines())


def test_checkpoint_loads_in_transformers_and_models_llama_with_equal_logits(built):
    from transformers import AutoModelForCausalLM

    from models.llama import load_target

    _, target, *_ = built
    cfg = json.loads((target / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True
    assert cfg["torch_dtype"] == "bfloat16" and "rope_theta" in cfg
    hf = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    ours = load_target(target, dtype=torch.float32)
    ids = torch.randint(0, cfg["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(hf(input_ids=ids).logits, ours(ids).logits, atol=1e-4)


def test_tokenizer_has_chatml_template_and_single_token_specials(built):
    from transformers import AutoTokenizer

    _, target, *_ = built
    tok = AutoTokenizer.from_pretrained(str(target))
    text = tok.apply_chat_template([{"role": "user", "content": "Write f()"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nWrite f()<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>"
    assert len(tok.encode("<|im_start|>", add_special_tokens=False)) == 1
    gen = json.loads((target / "generation_config.json").read_text())
    assert tok.convert_tokens_to_ids("<|im_end|>") in gen["eos_token_id"]


def test_provenance_and_resume(built):
    _, target, first, resumed = built
    prov = json.loads((target / "provenance.json").read_text())
    for key in ("script", "command", "data", "seed", "run", "hardware", "final", "eval_history"):
        assert key in prov
    assert prov["run"]["start_utc"] and prov["run"]["end_utc"] and prov["final"]["heldout_loss"] is not None
    assert "error" not in prov["verify"], prov["verify"]
    assert (target / "PROVENANCE.md").is_file()
    assert first["run"]["steps"] == 8 and resumed["run"]["steps"] == 12
    assert [h["step"] for h in resumed["eval_history"]] == [4, 8, 12]  # continued, not restarted


def test_shipped_size_arithmetic_fits_20mb():
    from transformers import LlamaConfig, LlamaForCausalLM

    from models.eagle3 import Eagle3Config, Eagle3Drafter

    small = dict(vocab=300, hidden=32, layers=2, heads=4, kv_heads=2, intermediate=48)
    rep = train_target.size_report(**small, draft_vocab=64)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))
    assert rep["target_params"] == sum(p.numel() for p in m.parameters())
    d = Eagle3Drafter(Eagle3Config(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                                   head_dim=8, vocab_size=300, draft_vocab_size=64, target_hidden_size=32))
    assert rep["drafter_params_estimate"] == sum(p.numel() for n, p in d.named_parameters() if "embed" not in n)
    a = train_target.parse_args(["--steps", "1"])  # the shipped defaults
    full = train_target.size_report(6144, a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate)
    assert full["target_bytes"] <= 15.5e6 and full["total_bytes_estimate"] <= 19.0e6  # + ~0.4 MB tokenizer
