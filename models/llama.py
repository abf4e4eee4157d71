"""Llama-family target model (Llama, Mistral, Qwen2 layouts) with aux hidden-state capture.

Loads a Hugging Face checkpoint directory (config.json + safetensors) and matches
`transformers.LlamaForCausalLM` logits. `aux_layer_ids` are captured as the OUTPUT of those
decoder layers (HF `hidden_states[i + 1]`), the training-side convention (models/aux_layers.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from models.aux_layers import default_aux_layer_ids
from models.gguf import gguf_file, gguf_q4_blocks, gguf_state_dict
from models.hf_config import read_hf_config
from models.kernel_plan import DEFAULT_PLAN
from models.layers import Attention, AttnInputs, KVCache, Linear, RMSNorm, SwiGLU, rope_cos_sin, rope_inv_freq
from models.q4_linear import keep_q4
from models.safetensors_io import load_state_dict


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None

    @classmethod
    def from_hf(cls, cfg: dict) -> "LlamaConfig":
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json: hidden_act {cfg['hidden_act']!r} is not supported (need silu)")
        heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
        theta = cfg.get("rope_theta") or (rope or {}).get("rope_theta", 10000.0)
        eos = cfg.get("eos_token_id")
        return cls(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"], num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads, num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=theta, rope_scaling=rope,
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", False),
            eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
            bos_token_id=cfg.get("bos_token_id"),
        )


class DecoderLayer(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                                   c.head_dim, c.hidden_size, bias=c.attention_bias)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size)

    def forward(self, x, cos, sin, inputs):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, inputs)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class TargetOutput:
    logits: torch.Tensor            # [B, T', vocab] for the requested positions
    aux_hidden: torch.Tensor | None  # [B, T, len(aux_layer_ids) * hidden] (low, mid, high concatenated)


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig, aux_layer_ids: list[int] | None = None):
        super().__init__()
        self.config = config
        self.kernel_plan = DEFAULT_PLAN   # its layers' (models.layers.set_kernel_plan)
        self.aux_layer_ids = list(aux_layer_ids or default_aux_layer_ids(config.num_hidden_layers))
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling),
                             persistent=False)

    def setup_cache(self, max_batch: int, max_len: int):
        w = self.embed_tokens.weight
        c = self.config
        for layer in self.layers:
            layer.self_attn.kv_cache = KVCache(max_batch, c.num_key_value_heads, max_len, c.head_dim, w.dtype, w.device)

    def forward(self, tokens: torch.Tensor, inputs: AttnInputs | None = None, *, capture_aux: bool = False,
                logits_at: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> TargetOutput:
        """tokens [B, T]. With `inputs` the static cache is used; without, plain causal attention.

        logits_at: optional [B, K] indices into T; logits are computed only there.
        """
        if inputs is not None:
            positions = inputs.positions
        elif positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        x = self.embed_tokens(tokens)
        cos, sin = rope_cos_sin(self.inv_freq, positions, x.dtype)
        captured = []
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, inputs)
            if capture_aux and i in self.aux_layer_ids:
                captured.append(x)
        if logits_at is not None:
            x = torch.gather(x, 1, logits_at.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        logits = self.lm_head(self.norm(x))
        aux = None
        if capture_aux:
            aux = self._aux_cat(captured)
        return TargetOutput(logits=logits, aux_hidden=aux)

    def _aux_cat(self, captured: list[torch.Tensor]) -> torch.Tensor:
        # `captured` is in layer order; the drafter expects the configured order (low, mid, high).
        order = sorted(set(self.aux_layer_ids))
        return torch.cat([captured[order.index(i)] for i in self.aux_layer_ids], dim=-1)


def load_target(path: str | Path, *, dtype=torch.float32, device="cpu",
                aux_layer_ids: list[int] | None = None, keep_gguf_q4: bool = False) -> LlamaModel:
    """Load a HF Llama-family checkpoint directory, or a GGUF one (dequantized), into LlamaModel.
    keep_gguf_q4: a GGUF's Q4_0/Q4_1 projections stay 4-bit (models/q4_linear.py; CPU only)."""
    cfg = read_hf_config(path)
    archs = cfg.get("architectures") or ["LlamaForCausalLM"]
    if not any(a in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM") for a in archs):
        raise ValueError(f"{Path(path) / 'config.json'}: architectures {archs} is not a Llama-family causal LM")
    if cfg.get("model_type") == "qwen2":
        cfg.setdefault("attention_bias", True)
    config = LlamaConfig.from_hf(cfg)
    with torch.device("meta"):
        model = LlamaModel(config, aux_layer_ids)
    state = gguf_state_dict(file) if (file := gguf_file(path)) is not None else load_state_dict(path)
    state = {k.removeprefix("model."): v for k, v in state.items()}
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.inv_freq = torch.empty(0)  # replaced below; meta buffers cannot move
    model = model.to(device=device, dtype=dtype).eval()
    # RoPE frequencies stay fp32 whatever the weight dtype (as in transformers).
    model.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling).to(device)
    if keep_gguf_q4:
        if file is None:
            raise ValueError(f"{path}: 4-bit weights are kept from a GGUF only, and this is not one")
        keep_q4(model, {k.removeprefix("model."): v for k, v in gguf_q4_blocks(file).items()})
    return model
