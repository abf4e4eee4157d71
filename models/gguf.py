"""Reading a GGUF Llama-family checkpoint (llama.cpp's format) as a Hugging Face one: a
LlamaForCausalLM-style config from its metadata, and its weights dequantized to float32 under
HF names, so every loader that takes a model directory can take a GGUF instead; or its 4-bit
blocks as they are, for layers that keep them (models/q4_linear.py).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quant_shape_to_byte_shape

from models.gguf_header import GGUFHeader, read_gguf_header

if TYPE_CHECKING:
    import torch

    from models.q4_linear import Q4Blocks

# The types gguf.quants.dequantize handles that tests/test_gguf.py checks.
SUPPORTED_TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0,
                   Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_LAYER_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_QKV_BIASES = ("attn_q.bias", "attn_k.bias", "attn_v.bias")


def gguf_file(path: str | Path) -> Path | None:
    """The GGUF checkpoint a model path names, or None for a Hugging Face directory: a file (or a
    missing *.gguf) is a GGUF; so is the one .gguf in a folder without config.json."""
    path = Path(path)
    if path.is_file() or path.suffix == ".gguf":
        return path
    if not path.is_dir() or (path / "config.json").exists():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        raise ValueError(f"{path}: {len(found)} .gguf files ({', '.join(f.name for f in found)}); "
                         f"name the one to load")
    return found[0] if found else None


def find_gguf(path: str | Path) -> Path:
    file = gguf_file(path)
    if file is None:
        raise FileNotFoundError(f"{path}: no .gguf file found")
    return file


def read_checked_header(path: str | Path) -> GGUFHeader:
    """The header of a GGUF this module can load: a supported architecture, tensor types and
    names; raises ValueError naming the file and what is wrong."""
    h = read_gguf_header(find_gguf(path))
    arch = h.metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{h.file}: architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
    n_layers = _meta(h, f"{arch}.block_count")
    for t in h.tensors.values():
        if t.type not in SUPPORTED_TYPES:
            raise ValueError(f"{h.file}: tensor {t.name!r} has quantization type {t.type.name}, which cannot be "
                             f"dequantized here (supported: {', '.join(q.name for q in SUPPORTED_TYPES)})")
        if t.name == "rope_freqs.weight":
            raise ValueError(f"{h.file}: tensor 'rope_freqs.weight' (Llama-3.1-style RoPE scaling) is not supported")
        if _hf_name(t.name, arch, n_layers) is None:
            raise ValueError(f"{h.file}: tensor {t.name!r} has no place in a {ARCHITECTURES[arch]}")
    return h


def gguf_hf_config(path: str | Path) -> dict[str, Any]:
    """A Hugging Face config.json dict for the GGUF at `path`, from its metadata alone (fast)."""
    h = read_checked_header(path)
    arch = h.metadata["general.architecture"]
    hidden, heads = _meta(h, f"{arch}.embedding_length"), _meta(h, f"{arch}.attention.head_count")
    head_dim = h.metadata.get(f"{arch}.attention.key_length") or hidden // heads
    rope_dims = h.metadata.get(f"{arch}.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise ValueError(f"{h.file}: RoPE on {rope_dims} of {head_dim} head dimensions is not supported")
    if arch == "qwen2" and any(f"blk.0.{b}" not in h.tensors for b in _QKV_BIASES):
        raise ValueError(f"{h.file}: qwen2 without q, k and v biases")
    if "token_embd.weight" not in h.tensors:
        raise ValueError(f"{h.file}: tensor 'token_embd.weight' is missing")
    return {
        "architectures": [ARCHITECTURES[arch]], "model_type": arch,
        "vocab_size": h.tensors["token_embd.weight"].shape[0],
        "hidden_size": hidden, "intermediate_size": _meta(h, f"{arch}.feed_forward_length"),
        "num_hidden_layers": _meta(h, f"{arch}.block_count"), "num_attention_heads": heads,
        "num_key_value_heads": h.metadata.get(f"{arch}.attention.head_count_kv") or heads, "head_dim": head_dim,
        "hidden_act": "silu", "rms_norm_eps": _meta(h, f"{arch}.attention.layer_norm_rms_epsilon"),
        "rope_theta": h.metadata.get(f"{arch}.rope.freq_base", 10000.0), "rope_scaling": _rope_scaling(h, arch),
        "max_position_embeddings": _meta(h, f"{arch}.context_length"),
        "attention_bias": arch == "qwen2", "tie_word_embeddings": "output.weight" not in h.tensors,
        "bos_token_id": h.metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": _eos_ids(h),
        "torch_dtype": "float32",
    }


def gguf_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The weights of the GGUF at `path`, dequantized to float32, under Hugging Face names."""
    import torch  # here only: the config readers above stay torch-free for launch checks

    return {name: torch.from_numpy(np.require(unpermute(dequantize(raw, t.type)), np.float32, ["C", "W"]))
            for name, t, raw, unpermute in _tensors(path)}


def gguf_q4_blocks(path: str | Path) -> dict[str, Q4Blocks]:
    """The GGUF's Q4_0 and Q4_1 tensors as 4-bit values with per-block scales and zeros (the
    form models/q4_linear.py keeps), under Hugging Face names. A block of 32 values is a
    float16 d (Q4_1: then a float16 m) and 16 bytes: value j in the low nibble of byte j,
    value 16 + j in its high nibble; Q4_0 is d * (q - 8), Q4_1 d * q + m."""
    import torch

    from models.q4_linear import GROUP, Q4Blocks

    out = {}
    for name, t, raw, unpermute in _tensors(path):
        if t.type not in (Q.Q4_0, Q.Q4_1):
            continue
        rows = raw.reshape(raw.shape[0], -1, raw.shape[-1] * GROUP // t.shape[-1])  # [out, blocks, bytes]
        d = rows[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        m = rows[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) if t.type == Q.Q4_1 else None
        qs = rows[..., 4:] if t.type == Q.Q4_1 else rows[..., 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(raw.shape[0], -1)
        zero = np.zeros_like(d) if m is None else m + 8 * d
        out[name] = Q4Blocks(*(torch.from_numpy(np.ascontiguousarray(unpermute(a))) for a in (q, d, zero)))
    return out


def _tensors(path: str | Path):
    """(HF name, tensor info, raw bytes [rows, bytes per row], the row order fix for q/k) per tensor."""
    h = read_checked_header(path)
    arch = h.metadata["general.architecture"]
    n_layers = h.metadata[f"{arch}.block_count"]  # read_checked_header made sure of it
    heads = _meta(h, f"{arch}.attention.head_count")
    kv_heads = h.metadata.get(f"{arch}.attention.head_count_kv") or heads
    data = np.memmap(h.file, dtype=np.uint8, mode="r")
    for t in h.tensors.values():
        raw = data[t.offset:t.offset + t.n_bytes].reshape(quant_shape_to_byte_shape(t.shape, t.type))
        n_head = heads if ".attn_q." in t.name else kv_heads if ".attn_k." in t.name else 0
        if arch != "llama" or not n_head:
            yield _hf_name(t.name, arch, n_layers), t, raw, lambda w: w
        else:
            yield _hf_name(t.name, arch, n_layers), t, raw, lambda w, n=n_head: _unpermute(w, n)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo the row order llama.cpp's converter gives q/k for its interleaved RoPE (HF rotates
    halves), as transformers' LlamaTensorProcessor._reverse_permute_weights does."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(name: str, arch: str, n_layers: int) -> str | None:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _LAYER_TENSOR.fullmatch(name)
    if m is None or int(m[1]) >= n_layers or m[2] not in _LAYER_NAMES:
        return None
    if m[3] == "bias" and not (arch == "qwen2" and f"{m[2]}.bias" in _QKV_BIASES):
        return None
    return f"model.layers.{m[1]}.{_LAYER_NAMES[m[2]]}.{m[3]}"


def _eos_ids(h: GGUFHeader) -> int | list[int] | None:
    """EOS, and llama.cpp's end-of-turn token when the file names a different one."""
    ids = [h.metadata[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in h.metadata]
    ids = list(dict.fromkeys(ids))
    return ids[0] if len(ids) == 1 else ids or None


def _rope_scaling(h: GGUFHeader, arch: str) -> dict | None:
    kind = h.metadata.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": _meta(h, f"{arch}.rope.scaling.factor")}
    raise ValueError(f"{h.file}: RoPE scaling {kind!r} is not supported (none, linear)")


def _meta(h: GGUFHeader, key: str) -> Any:
    if key not in h.metadata:
        raise ValueError(f"{h.file}: metadata {key!r} is missing")
    return h.metadata[key]
