"""Random-weight models of named shapes, built directly on the device, for speed measurements.

Decode speed depends on shapes and bytes, not on weight values, so an 8B-shaped target
(Llama-3-8B: hidden 4096, 32 layers, 32/8 heads, intermediate 14336, vocab 128256) and its
matching EAGLE-3 drafter stand in for checkpoints we cannot download. The same seed gives the
same weights in every process, which tensor-parallel ranks rely on before slicing.
"""
from __future__ import annotations

import contextlib

import torch

from models.eagle3 import Eagle3Config, Eagle3Drafter
from models.layers import fuse_projections, rope_inv_freq
from models.llama import LlamaConfig, LlamaModel

TARGETS = {
    "8b": LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=8192,
                      rope_theta=500000.0),
    # SmolLM2-135M-Instruct, the embedded default (its drafter: shipped/smollm2/drafter, draft vocabulary 8192):
    # stands in for the real pair where its 98 MB GGUF does not travel (a device call carries 64 MiB)
    "smollm2": LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                           num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                           rope_theta=100000.0, tie_word_embeddings=True),
    "tiny": LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024),
}
DRAFT_VOCAB = {"8b": 32000, "smollm2": 8192, "tiny": 256}


@contextlib.contextmanager
def _built(device, dtype: torch.dtype):
    """Modules built here are made on `device` in `dtype`."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


def _scale_(module: torch.nn.Module, std: float = 0.02) -> None:
    """Small normal weights keep activations finite through many random layers."""
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() > 1:
                p.normal_(0.0, std)


def random_target(shape: str | LlamaConfig, device, dtype=torch.bfloat16, seed: int = 0) -> LlamaModel:
    config = TARGETS[shape] if isinstance(shape, str) else shape
    torch.manual_seed(seed)
    with _built(device, dtype):
        model = LlamaModel(config)
    _scale_(model)
    model.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling).to(device)
    return model.eval().requires_grad_(False)


def random_drafter(target: LlamaModel, shape: str, seed: int = 1) -> Eagle3Drafter:
    """The EAGLE-3 drafter that matches a target: one layer of its width and heads, its embedding shared."""
    t, w = getattr(getattr(target, "tp", None), "full_config", None) or target.config, target.embed_tokens.weight
    cfg = Eagle3Config(hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                       num_attention_heads=t.num_attention_heads, num_key_value_heads=t.num_key_value_heads,
                       head_dim=t.head_dim, vocab_size=t.vocab_size, draft_vocab_size=DRAFT_VOCAB[shape],
                       target_hidden_size=t.hidden_size, aux_layer_ids=list(target.aux_layer_ids),
                       rope_theta=t.rope_theta, max_position_embeddings=t.max_position_embeddings)
    torch.manual_seed(seed)
    with _built(w.device, w.dtype):
        d = Eagle3Drafter(cfg)
    _scale_(d)
    d.embed_tokens.weight = target.embed_tokens.weight
    dv = cfg.draft_vocab_size
    used = torch.arange(dv, device=w.device) * (cfg.vocab_size // dv)
    d.d2t.copy_(used - torch.arange(dv, device=w.device))
    d.t2d.zero_()
    d.t2d[used] = True
    d.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling).to(w.device)
    return d.eval().requires_grad_(False)


def random_pair(shape: str, device: str, dtype: str):
    """A random target of `shape` and its random EAGLE-3 drafter, fused, as the engine loads a real pair."""
    from engine.loading import pick_device, pick_dtype

    dev = pick_device(device)
    target = random_target(shape, dev, pick_dtype(dtype, dev))
    drafter = random_drafter(target, shape)
    target.aux_layer_ids = list(drafter.config.aux_layer_ids)
    return fuse_projections(target), fuse_projections(drafter), dev
