"""Tensor parallelism for the Llama target as weight slicing plus all-reduce hooks (gpt-fast style).

Each rank keeps 1/world of every decoder layer: q/k/v and gate/up are column-parallel
(split by heads / intermediate channels), o_proj and down_proj row-parallel followed by a
sum all-reduce, so every rank ends each layer with the full, identical hidden state. The
embedding is replicated; lm_head is replicated or, with `vocab_parallel`, split by vocabulary
rows and all-gathered. Every rank then computes the same logits, so decode control flow
(argmax, acceptance, cache lengths) stays identical without extra communication, and a
replicated EAGLE-3 drafter sees the same aux hidden states everywhere.

`model.config` becomes this rank's shard config (local heads, KV heads, intermediate), so
`setup_cache` sizes the KV cache for local heads; the full config stays in `model.tp.full_config`.
All-reduces issued in forward hooks are plain c10d collectives in eager mode (CUDA-graph
capturable with NCCL once the process group has run one collective: warm it up before
capturing) and functional collectives under torch.compile.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from models.llama import LlamaConfig, LlamaModel


@dataclass
class TPInfo:
    rank: int
    world_size: int
    full_config: LlamaConfig
    vocab_parallel: bool
    group: object = None


def check_divisible(config: LlamaConfig, world_size: int, vocab_parallel: bool = False) -> None:
    """Name the dimension that does not split evenly over `world_size` ranks."""
    dims = {"num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
            "intermediate_size": config.intermediate_size}
    if vocab_parallel:
        dims["vocab_size"] = config.vocab_size
    for name, value in dims.items():
        if value % world_size:
            raise ValueError(f"tensor parallel size {world_size}: config {name}={value} is not divisible by it")


def _slice_rows(linear: nn.Linear, rank: int, parts: int) -> None:
    """Column-parallel: keep this rank's output features (weight rows, bias)."""
    n = linear.out_features // parts
    linear.weight = nn.Parameter(linear.weight.data[rank * n:(rank + 1) * n].clone(), requires_grad=False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.data[rank * n:(rank + 1) * n].clone(), requires_grad=False)
    linear.out_features = n


def _slice_cols(linear: nn.Linear, rank: int, parts: int) -> None:
    """Row-parallel: keep this rank's input features (weight columns); output is a partial sum."""
    n = linear.in_features // parts
    linear.weight = nn.Parameter(linear.weight.data[:, rank * n:(rank + 1) * n].clone(), requires_grad=False)
    linear.in_features = n


# torch >= 2.12 renames all_gather_into_tensor (dim-0 concatenation) to all_gather_single.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def _all_reduce_hook(group):
    def hook(module, args, output):
        if _compiling():  # functional collectives trace into torch.compile graphs (gpt-fast)
            from torch.distributed import _functional_collectives as funcol
            return funcol.all_reduce(output, "sum", group or dist.group.WORLD)
        dist.all_reduce(output, op=dist.ReduceOp.SUM, group=group)
        return output
    return hook


def _all_gather_vocab_hook(group, world_size: int):
    def hook(module, args, output):
        # output [..., V/world] -> [..., V]: gather along dim 0, then move the rank axis next to vocab.
        out = output.contiguous()
        if _compiling():
            from torch.distributed import _functional_collectives as funcol
            gathered = funcol.all_gather_tensor(out, 0, group or dist.group.WORLD)
        else:
            gathered = torch.empty((world_size * out.shape[0], *out.shape[1:]), dtype=out.dtype, device=out.device)
            _all_gather(gathered, out, group=group)
        gathered = gathered.view(world_size, *out.shape)
        return gathered.movedim(0, -2).reshape(*out.shape[:-1], world_size * out.shape[-1])
    return hook


def shard_model(model: LlamaModel, rank: int, world_size: int, group=None,
                vocab_parallel: bool = False) -> LlamaModel:
    """Slice a loaded (full, identical on every rank) LlamaModel in place for rank `rank`.

    Call before `setup_cache`. Requires heads, KV heads and intermediate size divisible by
    world_size (and the vocabulary too with vocab_parallel).
    """
    full = model.config
    check_divisible(full, world_size, vocab_parallel)
    if world_size == 1:
        model.tp = TPInfo(rank, 1, full, False, group)
        return model
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for lin in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
            _slice_rows(lin, rank, world_size)
        for lin in (attn.o_proj, mlp.down_proj):
            _slice_cols(lin, rank, world_size)
            lin.register_forward_hook(_all_reduce_hook(group))
        attn.heads //= world_size
        attn.kv_heads //= world_size
        attn.kv_cache = None
    if vocab_parallel:
        if full.tie_word_embeddings:  # untie: the embedding stays whole
            model.lm_head.weight = nn.Parameter(model.lm_head.weight.data.clone(), requires_grad=False)
        _slice_rows(model.lm_head, rank, world_size)
        model.lm_head.register_forward_hook(_all_gather_vocab_hook(group, world_size))
    model.config = dataclasses.replace(
        full, num_attention_heads=full.num_attention_heads // world_size,
        num_key_value_heads=full.num_key_value_heads // world_size,
        intermediate_size=full.intermediate_size // world_size)
    model.tp = TPInfo(rank, world_size, full, vocab_parallel, group)
    return model


def warm_up(device: torch.device, group=None) -> None:
    """Run one collective so NCCL communicators exist before any CUDA graph capture."""
    x = torch.ones(1, device=device)
    dist.all_reduce(x, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
