"""What training needs of a target it does not run: its shape from config.json, and three
tensors read alone from its safetensors (the embedding, the final norm, the lm_head).

With features from another engine (drafter/features.py) the trainer never loads the whole
target: the drafter's frozen embedding is the target's `embed_tokens`, and the target's
next-token distribution is recomputed from the captured last-layer output with the final norm
and lm_head, so nothing vocabulary-sized is stored. The final norm is RMSNorm (`w * x / rms(x)`),
as in the Llama, Qwen, Mistral and DeepSeek families.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from safetensors import safe_open

from models.hf_config import read_hf_config
from models.layers import RMSNorm
from models.safetensors_io import weight_files

ROPE_TYPES = ("default", "linear", "llama3")  # what models.layers.rope_inv_freq computes


@dataclass
class TargetSpec:
    """The target fields a drafter config is built from (the names of models.llama.LlamaConfig)."""
    architectures: list[str]
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool

    @classmethod
    def from_dir(cls, path: str | Path) -> "TargetSpec":
        cfg = read_hf_config(path)
        archs = cfg.get("architectures") or []
        if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):   # multimodal wrappers
            cfg = {**cfg["text_config"], "tie_word_embeddings": cfg.get("tie_word_embeddings", False)}
        where = Path(path) / "config.json"
        missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads") if k not in cfg]
        if missing:
            raise ValueError(f"{where}: missing {missing}: not a decoder-only language model config")
        if str(cfg.get("model_type", "")).startswith("gemma"):
            raise ValueError(f"{where}: Gemma's final norm scales by 1 + w; only w * x / rms(x) is supported")
        heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
        theta = cfg.get("rope_theta") or (rope or {}).get("rope_theta", 10000.0)
        kind = (rope or {}).get("rope_type", (rope or {}).get("type", "default"))
        if rope and kind not in ROPE_TYPES:
            print(f"{where}: the target's rope scaling {kind!r} is not one the drafter layer computes; the drafter "
                  f"uses plain RoPE (theta {theta})", file=sys.stderr)
            rope = None
        return cls(
            architectures=list(archs), vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
            intermediate_size=cfg.get("intermediate_size") or 4 * cfg["hidden_size"],
            num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=theta, rope_scaling=rope,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)))


def _tensor_files(path: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file, from headers only."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return {k: path / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    names = {}
    for f in weight_files(path):
        with safe_open(str(f), "pt") as h:
            names.update({k: f for k in h.keys()})
    return names


def _pick(names: dict[str, Path], suffixes: tuple[str, ...]) -> str | None:
    """The outermost tensor outside the decoder layers (and DeepSeek's MTP layers) whose name ends
    with the first suffix that any name ends with."""
    for suffix in suffixes:
        found = sorted((k for k in names if k.endswith(suffix) and ".layers." not in k), key=len)
        if found:
            return found[0]
    return None


def load_head_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """{"embed", "norm", "lm_head"} of the target at `path`, each read alone."""
    path = Path(path)
    names = _tensor_files(path)
    keys = {"embed": _pick(names, ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")),
            "norm": _pick(names, ("model.norm.weight", ".norm.weight", "final_layernorm.weight")),
            "lm_head": _pick(names, ("lm_head.weight",))}
    if keys["lm_head"] is None:
        keys["lm_head"] = keys["embed"]   # tied embeddings
    missing = [k for k, v in keys.items() if v is None]
    if missing:
        raise ValueError(f"{path}: no {' / '.join(missing)} tensor found among its safetensors names "
                         f"(looked for embed_tokens.weight, model.norm.weight, lm_head.weight)")
    read: dict[str, torch.Tensor] = {}
    for name in set(keys.values()):   # a tied lm_head is the embedding, read once
        with safe_open(str(names[name]), "pt") as h:
            read[name] = h.get_tensor(name)
    return {role: read[name] for role, name in keys.items()}


class TargetHead(nn.Module):
    """The target's final norm + lm_head: last-layer output [.., H] -> logits [.., V]."""

    def __init__(self, norm: torch.Tensor, lm_head: torch.Tensor, eps: float):
        super().__init__()
        self.norm = RMSNorm(norm.numel(), eps)
        self.norm.weight = nn.Parameter(norm, requires_grad=False)
        self.lm_head = nn.Parameter(lm_head, requires_grad=False)

    def forward(self, last: torch.Tensor) -> torch.Tensor:
        x = self.norm(last.to(self.lm_head.dtype))
        return x @ self.lm_head.t()
