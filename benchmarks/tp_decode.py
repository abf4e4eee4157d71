"""Batch-1 decode speed of the native engine with the target tensor-parallel over N GPUs.

One process per GPU (torchrun); every rank builds the same random-weight target (or loads a
checkpoint), keeps its shard (engine/tensor_parallel.py) and decodes with BatchDecoder
(CUDA graphs, the all-reduces inside them), so NCCL settings from the environment are
measured end to end. Also reports the bytes each rank streams per token against the copy
bandwidth measured on the same GPU (the roofline for batch-1 decode). Rank 0 prints and
writes JSON. Without torchrun it runs as a single process (TP 1).

  torchrun --nproc-per-node 2 -m benchmarks.tp_decode --shape 8b --name tp2-default
  NCCL_PROTO=LL NCCL_ALGO=Ring torchrun --nproc-per-node 2 -m benchmarks.tp_decode --name tp2-LL-Ring
  torchrun --nproc-per-node 2 -m benchmarks.tp_decode --profile reference --name tp2-profile
  python -m benchmarks.tp_decode --shape 8b --name tp1        # one GPU
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.report import provenance, write_json
from benchmarks.shapes import random_drafter, random_target, weight_bytes
from benchmarks.timing import copy_bandwidth
from engine.decoder import BatchDecoder, SpecConfig
from engine.sampling import BatchSampling
from engine.tensor_parallel import shard_model, warm_up
from models.layers import fuse_projections

PROJECT_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = PROJECT_ROOT / "benchmarks" / "results" / "tp_decode"


def decode_rate(dec: BatchDecoder, prompt: list[int], tokens: int) -> tuple[float, float]:
    """(tok/s after the first token, tokens per step), step by step. Not the engine's loop
    (benchmarks/engine_load.py): the native engine runs in one process, while here every rank
    drives its own decoder and must run exactly the steps the others run (the all-reduces pair
    up), so no step is launched ahead and none stops early (EOS does not end the reply)."""
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8b", choices=["8b", "tiny"], help="random-weight target shape")
    ap.add_argument("--model", help="load this checkpoint instead of a random target")
    ap.add_argument("--draft", help="EAGLE-3 drafter for --model (replicated on every rank)")
    ap.add_argument("--random-draft", action="store_true", help="a random drafter of the matching shape")
    ap.add_argument("--steps", type=int, default=0, help="speculative steps (0: none)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vocab-parallel", action="store_true", help="split lm_head by vocabulary + all-gather")
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--compile", action="store_true", help="torch.compile the decode step (collectives as funcol)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--profile", help="apply this launch profile's [env] (NCCL settings) before NCCL starts")
    ap.add_argument("--watchdog-s", type=float, default=0,
                    help="after this many seconds dump every thread's stack and exit (finds hangs)")
    ap.add_argument("--name", help="output stem (default tp<N>-<shape>)")
    ap.add_argument("--out-dir", default=str(RESULTS_DIR))
    args = ap.parse_args(argv)

    if args.profile:  # the environment a server started with this profile would have
        from launch.profiles import resolve
        os.environ.update(resolve(args.profile).env)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # required on the lent machines; before NCCL starts
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.watchdog_s:
        import faulthandler
        faulthandler.dump_traceback_later(args.watchdog_s, exit=True)
    t_start = time.perf_counter()

    def stage(msg: str) -> None:
        print(f"[rank {rank} +{time.perf_counter() - t_start:.1f}s] {msg}", file=sys.stderr, flush=True)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[args.dtype]
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                                **({"device_id": device} if cuda else {}))

    stage("process group up" if world > 1 else "start")
    if args.model:
        from models.llama import load_target
        target = load_target(args.model, dtype=dtype, device=device)
    else:
        target = random_target(args.shape, device, dtype)
    drafter = None
    if args.steps and (args.draft or args.random_draft):
        if args.draft:
            from models.eagle3_checkpoint import load_drafter
            drafter = load_drafter(args.draft, target.embed_tokens.weight, lm_head=target.lm_head.weight,
                                   dtype=dtype, device=device)
            target.aux_layer_ids = list(drafter.config.aux_layer_ids)
        else:
            drafter = random_drafter(target, args.shape)
    fuse_projections(shard_model(target, rank, world, vocab_parallel=args.vocab_parallel))
    if drafter is not None:
        fuse_projections(drafter)
    stage("model built and sliced")
    if world > 1:
        warm_up(device)
        stage("first all-reduce done")
    bw = copy_bandwidth(gib=2) / 1e9 if cuda else None  # GB/s, on this rank's GPU

    spec = SpecConfig(args.steps) if drafter is not None else None
    dec = BatchDecoder(target, drafter, spec, 1, args.prompt_len + args.tokens + 64,
                       cuda_graphs=cuda and not args.no_graphs, compile=args.compile)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.config.vocab_size, (args.prompt_len,), generator=gen).tolist()
    decode_rate(dec, prompt, min(args.tokens, 32))  # warm-up and graph capture
    stage("warm-up decode (graph capture) done")
    runs = [decode_rate(dec, prompt, args.tokens) for _ in range(args.repeats)]
    tok_s = statistics.median(r[0] for r in runs)

    per_token = weight_bytes(target) / (runs[0][1] if spec else 1.0)  # spec: one target pass per step
    result = {
        "name": args.name or f"tp{world}-{Path(args.model).name if args.model else args.shape}",
        "world_size": world, "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "dtype": args.dtype, "shape": None if args.model else args.shape, "model": args.model,
        "speculative": {"steps": args.steps, "draft": args.draft or ("random" if drafter else None),
                        "tokens_per_step": statistics.mean(r[1] for r in runs)} if spec else None,
        "graphs": cuda and not args.no_graphs, "compile": args.compile, "vocab_parallel": args.vocab_parallel,
        "tok_s": tok_s, "ms_per_token": 1000.0 / tok_s, "runs_tok_s": [r[0] for r in runs],
        "weight_bytes_per_rank": weight_bytes(target),
        "achieved_gb_s_per_rank": per_token * tok_s / 1e9 if not spec else None,
        "copy_bandwidth_gb_s": bw,
        "fraction_of_copy_bandwidth": per_token * tok_s / 1e9 / bw if bw and not spec else None,
        "profile": args.profile,
        "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")},
        "nccl_version": ".".join(map(str, torch.cuda.nccl.version())) if cuda and world > 1 else None,
        "torch": torch.__version__, "provenance": provenance(argv),
    }
    path = write_json(Path(args.out_dir) / f"{result['name']}.json", result) if rank == 0 else None
    stage("measured")
    if args.watchdog_s:
        import faulthandler
        faulthandler.cancel_dump_traceback_later()
    if world > 1:
        # Graphs holding NCCL kernels must go before the communicator (the first 2-GPU run
        # hung at the end, with them alive, before writing anything).
        dec.graphs.graphs.clear()
        torch.cuda.synchronize(device)
        dist.barrier()
        dist.destroy_process_group()
    if rank != 0:
        return None
    print(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
