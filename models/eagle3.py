"""The EAGLE-3 drafter: one Llama decoder layer over [embedding ; fused target hidden].

fc fuses the concatenated aux hidden states (3 * H_target -> H). The layer's q/k/v read
cat(input_layernorm(embed(token)), hidden_norm(hidden)) (2H wide); the residual stream is the
hidden branch. The output hidden state (before the final norm) is fed back as the next
step's hidden input. lm_head scores the draft vocabulary; `d2t` maps draft ids to target ids.
A drafter with `shared_head` has no lm_head of its own: it borrows the target's (full
vocabulary, frozen, never saved), as EAGLE-1/2 did and as SGLang and vLLM serve it.

EAGLE-3.1 (arXiv 2605.09992), two options SGLang and vLLM read from config.json:
- `fc_norm`: an RMSNorm of its own on each captured target state before fc (`fc_norm.{i}`), so
  the three layers' very different scales reach fc normalised;
- `norm_output`: the hidden state fed back to the next draft step is the final-normed one (the
  state lm_head reads), not the pre-norm residual stream.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from models.kernel_plan import DEFAULT_PLAN
from models.layers import Attention, AttnInputs, KVCache, Linear, RMSNorm, SwiGLU, rope_cos_sin, rope_inv_freq


@dataclass
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: list[int] = field(default_factory=list)  # target layer OUTPUTS captured in training
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    num_aux: int = 3
    shared_head: bool = False   # lm_head is the target's, borrowed at load (draft_vocab_size == vocab_size)
    fc_norm: bool = False       # EAGLE-3.1: RMSNorm per captured state before fc
    norm_output: bool = False   # EAGLE-3.1: feed back the final-normed hidden state


class Eagle3Layer(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        h = c.hidden_size
        self.input_layernorm = RMSNorm(h, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, c.rms_norm_eps)
        self.self_attn = Attention(2 * h, c.num_attention_heads, c.num_key_value_heads, c.head_dim, h)
        self.post_attention_layernorm = RMSNorm(h, c.rms_norm_eps)
        self.mlp = SwiGLU(h, c.intermediate_size)

    def forward(self, emb, hidden, cos, sin, inputs):
        residual = hidden
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)
        x = residual + self.self_attn(x, cos, sin, inputs)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class DraftOutput:
    logits: torch.Tensor   # [B, T, draft_vocab]
    hidden: torch.Tensor   # [B, T, H], pre-norm, fed back as the next step's hidden input


class Eagle3Drafter(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.config = config
        self.kernel_plan = DEFAULT_PLAN   # its layers' (models.layers.set_kernel_plan)
        h = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)  # frozen: the target's embedding
        self.fc = Linear(config.num_aux * config.target_hidden_size, h, bias=False)
        if config.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(config.target_hidden_size, config.rms_norm_eps)
                                         for _ in range(config.num_aux))
        self.midlayer = Eagle3Layer(config)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = Linear(h, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.register_buffer("inv_freq", rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling),
                             persistent=False)

    def setup_cache(self, max_batch: int, max_len: int):
        c, w = self.config, self.fc.weight
        self.midlayer.self_attn.kv_cache = KVCache(max_batch, c.num_key_value_heads, max_len, c.head_dim,
                                                   w.dtype, w.device)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, inputs: AttnInputs | None = None,
                positions: torch.Tensor | None = None, logits_at: torch.Tensor | None = None) -> DraftOutput:
        """tokens [B, T]; hidden [B, T, 3*H_target] (target aux states) or [B, T, H] (own output).
        logits_at: optional [B, K] indices into T; the output (logits and hidden) is only there,
        so a forward that writes T positions' keys and values scores one (lm_head is about half
        the drafter's weights)."""
        if hidden.shape[-1] != self.config.hidden_size:
            hidden = self.fuse(hidden)
        if inputs is not None:
            positions = inputs.positions
        elif positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        emb = self.embed_tokens(tokens).to(hidden.dtype)
        cos, sin = rope_cos_sin(self.inv_freq, positions, hidden.dtype)
        out = self.midlayer(emb, hidden, cos, sin, inputs)
        if logits_at is not None:
            out = torch.gather(out, 1, logits_at.unsqueeze(-1).expand(-1, -1, out.shape[-1]))
        normed = self.norm(out)
        return DraftOutput(logits=self.lm_head(normed), hidden=normed if self.config.norm_output else out)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """[..., num_aux * H_target] captured target states -> [..., H]: fc, after each state's
        own RMSNorm with fc_norm."""
        if self.config.fc_norm:
            parts = aux.chunk(self.config.num_aux, dim=-1)
            aux = torch.cat([norm(x) for norm, x in zip(self.fc_norm, parts)], dim=-1)
        return self.fc(aux)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]
