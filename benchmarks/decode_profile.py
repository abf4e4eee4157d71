"""Where does a batch-1 engine step spend its GPU time? (ours, compiled and graphs only)

Profiles the engine's own step (BatchDecoder, fused projections, torch.compile, CUDA graph;
and graphs only) with torch.profiler and groups kernels (GEMVs as cuBLAS or as Triton
reductions, attention, other fused Triton, other). Without --model: a plain decode step of
the 8B shape against the weight-read floor. With --model/--draft: the plain step (0) and the
greedy chain cycles of --chain-steps for a checkpoint pair (what a speculative cycle costs
beyond a decode step, kernel by kernel). Each 8B weight matrix's GEMV alone, per kernel
choice: benchmarks/decode_kernels.py. Writes JSON and a text table.

  python -m benchmarks.decode_profile --out-dir benchmarks/results/h200_run2/profile
  python -m benchmarks.decode_profile --model shipped/target --draft shipped/drafter --chain-steps 0,3,5 --out-dir DIR
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks.h200_decode import copy_bandwidth
from benchmarks.shapes import random_target, weight_bytes
from engine.decoder import BatchDecoder, SpecConfig
from engine.sampling import BatchSampling
from models.layers import fuse_projections


def kind(name: str) -> str:
    n = name.lower()
    if any(s in n for s in ("flash", "fmha", "attention", "efficient", "sdpa")) and "triton" not in n:
        return "attention"  # first: cuDNN's attention kernels are named sm90_... too
    if any(s in n for s in ("gemv", "gemm", "cutlass", "xmma", "nvjet", "sm90", "cublas")):
        return "gemv (cuBLAS)"
    if "triton" in n and "_sum" in n:
        return "gemv (triton reduction)"
    if "triton" in n:
        return "triton (fused elementwise/norms)"
    return "other"


def step_label(chain_steps: int) -> str:
    """How a profiled engine step is named in the results: plain (0) or chain N."""
    return f"chain {chain_steps}" if chain_steps else "plain"


def label_steps(label: str) -> int:
    """step_label's inverse."""
    return 0 if label == "plain" else int(label.removeprefix("chain "))


def profile_step(target, steps: int, compile: bool, drafter=None, spec: SpecConfig | None = None) -> dict:
    dec = BatchDecoder(target, drafter, spec, max_batch=1, max_context=1024, compile=compile)
    s = BatchSampling.all_greedy_rows(1, "cuda")
    dec.prefill(0, list(range(10, 42)), s)
    ctx = dec.lens[0]

    def step():
        dec.lens[0] = ctx  # rewind: the same positions every step, whatever was accepted
        dec.step(1, s)

    for _ in range(8):
        step()  # compile + capture
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[e.name][0] += e.device_time_total / steps / 1000.0  # ms per step
            per_kernel[e.name][1] += 1
    by_kind: dict[str, float] = defaultdict(float)
    for name, (ms, _) in per_kernel.items():
        by_kind[kind(name)] += ms
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:30]
    return {"kernel_ms_per_step": sum(by_kind.values()), "by_kind_ms": dict(by_kind),
            "kernels_per_step": sum(c for _, c in per_kernel.values()) / steps,
            "top": [{"kernel": k[:140], "ms_per_step": v[0], "calls_per_step": v[1] / steps} for k, v in top]}


def profile_8b(steps: int) -> tuple[dict, list[str]]:
    bw = copy_bandwidth()
    target = fuse_projections(random_target("8b", "cuda"))
    streamed = weight_bytes(target)
    res = {"copy_bandwidth_Bps": bw, "streamed_bytes_per_token": streamed,
           "weight_read_floor_ms": streamed / bw * 1000}
    for mode, compile in (("compiled", True), ("graphs_only", False)):
        res[mode] = profile_step(target, steps, compile)
    return res, [f"copy bandwidth {bw / 1e12:.2f} TB/s; weight-read floor {res['weight_read_floor_ms']:.2f} ms/token"]


def profile_pair(model: str, draft: str, chain_steps: list[int], steps: int,
                 modes: list[str]) -> tuple[dict, list[str]]:
    from engine.loading import NativeEngineArgs, load_models
    target, drafter, _ = load_models(NativeEngineArgs(model=model, draft=draft, spec=SpecConfig(1), device="cuda"))
    res: dict = {"model": model, "draft": draft}
    for prefix in modes:
        compile = prefix == "compiled"
        for n in chain_steps:
            res[f"{prefix} {step_label(n)}"] = profile_step(
                target, steps, compile, drafter if n else None, SpecConfig(n) if n else None)
    return res, [f"{model} + {draft}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--model", help="target checkpoint: profile it (and --draft's chain cycles), not the 8B shape")
    ap.add_argument("--draft")
    ap.add_argument("--chain-steps", default="0,3,5", help="with --model: chain cycles to profile (0: plain decode)")
    ap.add_argument("--modes", default="compiled,graphs_only",
                    help="with --model: compiled and/or graphs_only (a compile of a small pair takes minutes)")
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        if args.model:
            res, lines = profile_pair(args.model, args.draft, [int(n) for n in args.chain_steps.split(",")], args.steps,
                                      args.modes.split(","))
        else:
            res, lines = profile_8b(args.steps)
    res.update(device=torch.cuda.get_device_name(), torch=torch.__version__)
    name = "pair_profile" if args.model else "decode_profile"
    (out / f"{name}.json").write_text(json.dumps(res, indent=2))
    for mode, p in res.items():
        if not isinstance(p, dict) or "by_kind_ms" not in p:
            continue
        lines.append(f"\n{mode}: kernels {p['kernel_ms_per_step']:.3f} ms/step, "
                     f"{p['kernels_per_step']:.0f} kernels/step")
        lines += [f"  {k:<40} {v:7.3f} ms" for k, v in sorted(p["by_kind_ms"].items(), key=lambda kv: -kv[1])]
        lines += [f"    {t['ms_per_step']:7.3f} ms {t['calls_per_step']:5.0f}x  {t['kernel']}" for t in p["top"][:15]]
    (out / f"{name}.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
