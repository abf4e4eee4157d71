"""Tensor parallelism for the Llama target, gpt-fast style, and the batch-1 decode it gives.

Production engines (SGLang, vLLM) own tensor parallelism; this is the measuring stick for NCCL
settings end to end. Each rank keeps 1/world of every decoder layer: q/k/v and gate/up split by
heads / intermediate channels (column-parallel), o_proj and down_proj by input (row-parallel)
followed by a sum all-reduce, so every rank ends each layer with the same hidden state. The
embedding is replicated; lm_head too or, with `vocab_parallel`, split by vocabulary and
all-gathered. Every rank computes the same logits, so decode control flow stays identical
without extra communication, and a replicated EAGLE-3 drafter sees the same aux states.
`model.config` becomes the rank's shard config (KV caches sized for local heads); the full one
stays in `model.tp.full_config`. The all-reduces are c10d collectives in eager mode (capturable
in CUDA graphs once the group has run one: `warm_up`) and functional collectives when compiled.

`main`: one process per GPU (torchrun); every rank builds the same random target, keeps its
shard and decodes with BatchDecoder (CUDA graphs, the all-reduces inside them), so NCCL settings
from the environment (or --profile's [env]) are measured end to end, with the bytes each rank
streams per token against the copy bandwidth of its GPU. Rank 0 writes JSON. Without torchrun:
one process (TP 1).

  torchrun --nproc-per-node 2 -m benchmarks nccl decode --shape 8b --profile reference --name tp2
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

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
            "intermediate_size": config.intermediate_size, **({"vocab_size": config.vocab_size} if vocab_parallel
                                                               else {})}
    for name, value in dims.items():
        if value % world_size:
            raise ValueError(f"tensor parallel size {world_size}: config {name}={value} is not divisible by it")


def _keep(linear: nn.Linear, rank: int, parts: int, dim: int) -> None:
    """Keep this rank's output features (dim 0: column-parallel, with the bias) or input features
    (dim 1: row-parallel, the output a partial sum)."""
    n = linear.weight.shape[dim] // parts
    linear.weight = nn.Parameter(linear.weight.data.narrow(dim, rank * n, n).clone(), requires_grad=False)
    if dim == 0 and linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.data[rank * n:(rank + 1) * n].clone(), requires_grad=False)
    setattr(linear, "out_features" if dim == 0 else "in_features", n)


# torch >= 2.12 renames all_gather_into_tensor (dim-0 concatenation) to all_gather_single.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _all_reduce_hook(group):
    def hook(module, args, output):
        if torch.compiler.is_compiling():  # functional collectives trace into compiled graphs
            from torch.distributed import _functional_collectives as funcol
            return funcol.all_reduce(output, "sum", group or dist.group.WORLD)
        dist.all_reduce(output, op=dist.ReduceOp.SUM, group=group)
        return output
    return hook


def _all_gather_vocab_hook(group, world_size: int):
    def hook(module, args, output):
        # output [..., V/world] -> [..., V]: gather along dim 0, then move the rank axis next to vocab.
        out = output.contiguous()
        if torch.compiler.is_compiling():
            from torch.distributed import _functional_collectives as funcol
            gathered = funcol.all_gather_tensor(out, 0, group or dist.group.WORLD)
        else:
            gathered = torch.empty((world_size * out.shape[0], *out.shape[1:]), dtype=out.dtype, device=out.device)
            _all_gather(gathered, out, group=group)
        gathered = gathered.view(world_size, *out.shape)
        return gathered.movedim(0, -2).reshape(*out.shape[:-1], world_size * out.shape[-1])
    return hook


def shard_model(model: LlamaModel, rank: int, world_size: int, group=None, vocab_parallel: bool = False) -> LlamaModel:
    """Slice a loaded LlamaModel (whole and identical on every rank) in place for `rank`, before
    `setup_cache`."""
    full = model.config
    check_divisible(full, world_size, vocab_parallel)
    model.tp = TPInfo(rank, world_size, full, vocab_parallel and world_size > 1, group)
    if world_size == 1:
        return model
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for lin in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
            _keep(lin, rank, world_size, 0)
        for lin in (attn.o_proj, mlp.down_proj):
            _keep(lin, rank, world_size, 1)
            lin.register_forward_hook(_all_reduce_hook(group))
        attn.heads //= world_size
        attn.kv_heads //= world_size
        attn.kv_cache = None
    if vocab_parallel:
        if full.tie_word_embeddings:  # untie: the embedding stays whole
            model.lm_head.weight = nn.Parameter(model.lm_head.weight.data.clone(), requires_grad=False)
        _keep(model.lm_head, rank, world_size, 0)
        model.lm_head.register_forward_hook(_all_gather_vocab_hook(group, world_size))
    model.config = dataclasses.replace(
        full, num_attention_heads=full.num_attention_heads // world_size,
        num_key_value_heads=full.num_key_value_heads // world_size,
        intermediate_size=full.intermediate_size // world_size)
    return model


def warm_up(device: torch.device, group=None) -> None:
    """Run one collective so NCCL communicators exist before any CUDA graph capture."""
    dist.all_reduce(torch.ones(1, device=device), group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_rate(dec, prompt: list[int], tokens: int) -> tuple[float, float]:
    """(tok/s after the first token, tokens per step), step by step: every rank drives its own
    decoder and must run exactly the steps the others run (the all-reduces pair up), so no step
    is launched ahead and none stops early."""
    from engine.sampling import BatchSampling

    s = BatchSampling.all_greedy_rows(1, dec.device)
    dec.prefill(0, prompt, s)
    sync = torch.cuda.synchronize if dec.device.type == "cuda" else (lambda: None)
    sync()
    t0, n, steps = time.perf_counter(), 1, 0
    while n < tokens:
        n, steps = n + len(dec.step(1, s)[0].tokens), steps + 1
    sync()
    return (n - 1) / (time.perf_counter() - t0), (n - 1) / steps


def main(argv: list[str] | None = None) -> dict | None:
    from benchmarks.report import provenance, write_json
    from benchmarks.shapes import random_drafter, random_target, weight_bytes
    from benchmarks.timing import copy_bandwidth
    from engine.decoder import BatchDecoder, SpecConfig
    from models.layers import fuse_projections

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8b", choices=["8b", "tiny"], help="random-weight target shape")
    ap.add_argument("--steps", type=int, default=0, help="speculative steps with a random drafter (0: none)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vocab-parallel", action="store_true", help="split lm_head by vocabulary + all-gather")
    ap.add_argument("--compile", action="store_true", help="torch.compile the decode step (collectives as funcol)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--profile", help="apply this launch profile's [env] (NCCL settings) before NCCL starts")
    ap.add_argument("--name", help="output stem (default tp<N>-<shape>)")
    ap.add_argument("--out-dir", default="runs/tp_decode")
    args = ap.parse_args(argv)
    if args.profile:  # the environment a server started with this profile would have
        from launch.profiles import resolve
        os.environ.update(resolve(args.profile).env)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # required on the lent machines; before NCCL starts
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu")
    dtype = getattr(torch, args.dtype)
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                                **({"device_id": device} if cuda else {}))
    target = random_target(args.shape, device, dtype)
    drafter = fuse_projections(random_drafter(target, args.shape)) if args.steps else None
    fuse_projections(shard_model(target, rank, world, vocab_parallel=args.vocab_parallel))
    if world > 1:
        warm_up(device)
    bw = copy_bandwidth(gib=2) / 1e9 if cuda else None  # GB/s, on this rank's GPU
    spec = SpecConfig(args.steps) if drafter is not None else None
    dec = BatchDecoder(target, drafter, spec, 1, args.prompt_len + args.tokens + 64, cuda_graphs=cuda,
                       compile=args.compile)
    prompt = torch.randint(0, target.config.vocab_size, (args.prompt_len,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    decode_rate(dec, prompt, min(args.tokens, 32))  # warm-up and graph capture
    runs = [decode_rate(dec, prompt, args.tokens) for _ in range(args.repeats)]
    tok_s = statistics.median(r[0] for r in runs)
    per_token = weight_bytes(target) * tok_s / 1e9 if not spec else None  # GB/s: every weight once a token
    result = {
        "name": args.name or f"tp{world}-{args.shape}", "world_size": world, "shape": args.shape,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu", "dtype": args.dtype,
        "speculative": {"steps": args.steps, "tokens_per_step": statistics.mean(r[1] for r in runs)} if spec else None,
        "compile": args.compile, "vocab_parallel": args.vocab_parallel,
        "tok_s": tok_s, "ms_per_token": 1000.0 / tok_s, "runs_tok_s": [r[0] for r in runs],
        "weight_bytes_per_rank": weight_bytes(target), "achieved_gb_s_per_rank": per_token,
        "copy_bandwidth_gb_s": bw, "fraction_of_copy_bandwidth": per_token / bw if bw and per_token else None,
        "profile": args.profile, "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")},
        "nccl_version": ".".join(map(str, torch.cuda.nccl.version())) if cuda and world > 1 else None,
        "torch": torch.__version__, "provenance": provenance(argv)}
    if world > 1:
        # Graphs holding NCCL kernels must go before the communicator (a run hung at the end with them alive).
        dec.graphs.graphs.clear()
        if cuda:
            torch.cuda.synchronize(device)
        dist.barrier()
        dist.destroy_process_group()
    if rank != 0:
        return None
    path = write_json(Path(args.out_dir) / f"{result['name']}.json", result)
    print(json.dumps(result, indent=2) + f"\nwrote {path}")
    return result
