"""Where a compiled batch-1 engine step spends its GPU time: a plain step against a chain cycle
or a tree cycle (`--settings tree --tree 6x8x32`, added in session 21).
(Session 20's calls 1-2 ran it at 6c4b7af, where a verify's few-row products could also be
reductions; that form lost, benchmarks/results/h200_s20/README.md.)

Each setting is the engine's own step (BatchDecoder, compiled, CUDA graph), rewound to the same
context every step. Reports the step's wall time in the engine loop (host read included) and
its kernels grouped by kind from torch.profiler.

    python3 benchmarks/results/h200_s20/cycle_profile.py --model runs/smollm2/target \
        --draft shipped/smollm2/drafter --steps 4 --out cycle_profile
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import torch

from benchmarks.shapes import random_pair
from engine.decoder import BatchDecoder, SpecConfig
from engine.loading import NativeEngineArgs, load_models
from engine.sampling import BatchSampling

KINDS = [("attention", ("flash", "fmha", "attention", "cudnn", "sdpa")),
         ("GEMM (cuBLAS)", ("gemv", "gemm", "cutlass", "xmma", "nvjet", "sm90", "cublas")),
         ("reduction (Triton)", ("triton_red", "triton_per")),
         ("elementwise (Triton)", ("triton_poi",))]


def kind(name: str) -> str:
    n = name.lower()
    return next((k for k, keys in KINDS if any(s in n for s in keys)), "other")


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def profile(target, drafter, spec: SpecConfig | None, iters: int) -> dict:
    dec = BatchDecoder(target, drafter if spec else None, spec, max_batch=1, max_context=1024, compile=True)
    greedy = BatchSampling.all_greedy_rows(1, dec.device)
    dec.prefill(0, list(range(100, 228)), greedy)
    ctx = dec.lens[0]

    def step():
        dec.lens[0] = ctx  # the same positions every step, whatever was accepted
        dec.step(1, greedy)

    t0 = time.perf_counter()
    for _ in range(5):
        step()  # compile and capture
    warm_s = time.perf_counter() - t0
    walls = []
    for _ in range(iters):
        sync(dec.device)
        t0 = time.perf_counter()
        step()
        walls.append((time.perf_counter() - t0) * 1e3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA if dec.device.type == "cuda"
                                            else torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            step()
        sync(dec.device)
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA or dec.device.type == "cpu":
            per_kernel[e.name][0] += e.device_time_total / iters / 1e3
            per_kernel[e.name][1] += 1 / iters
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, (ms, n) in per_kernel.items():
        by_kind[kind(name)][0] += ms
        by_kind[kind(name)][1] += n
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:20]
    return {"warm_s": warm_s, "wall_ms": statistics.median(walls),
            "kernel_ms": sum(v[0] for v in by_kind.values()), "kernels": sum(v[1] for v in by_kind.values()),
            "by_kind": {k: {"ms": v[0], "kernels": v[1]} for k, v in by_kind.items()},
            "top": [{"kernel": k[:120], "ms": v[0], "calls": v[1]} for k, v in top]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="target checkpoint (with --draft); without: --shape with random weights")
    ap.add_argument("--draft")
    ap.add_argument("--shape", default="smollm2", help="random pair of this shape (benchmarks/shapes.py) "
                    "when no --model: a cycle's cost does not depend on what it accepts")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tree", default="6x8x32", help="the tree setting's steps x topk x draft tokens")
    ap.add_argument("--settings", default="chain,plain", help="which steps to profile, in order: chain, "
                    "tree, plain")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--device", default="cuda", help="cpu only to check the script (nothing is captured there)")
    ap.add_argument("--out", required=True, help="output stem: .json and .txt")
    args = ap.parse_args()
    if args.model:
        target, drafter, _ = load_models(NativeEngineArgs(model=args.model, draft=args.draft, spec=SpecConfig(1),
                                                          device=args.device, dtype="bfloat16"))
    else:
        target, drafter, _ = random_pair(args.shape, args.device, "bfloat16")
    res = {"model": args.model or f"random {args.shape}", "draft": args.draft or f"random {args.shape}",
           "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__}
    lines = []
    with torch.inference_mode():
        tree = [int(v) for v in args.tree.split("x")]
        settings = {"plain": ("plain", None), "chain": (f"chain {args.steps}", SpecConfig(args.steps)),
                    "tree": (f"tree {args.tree}", SpecConfig(*tree))}
        for label, spec in (settings[k] for k in args.settings.split(",")):
            p = res[label] = profile(target, drafter, spec, args.iters)
            section = [f"\n{label}: wall {p['wall_ms']:.3f} ms/step, kernels {p['kernel_ms']:.3f} ms in "
                       f"{p['kernels']:.0f}; warm-up {p['warm_s']:.0f} s"]
            section += [f"  {k:<22} {v['ms']:7.3f} ms {v['kernels']:5.0f} kernels" for k, v in
                        sorted(p["by_kind"].items(), key=lambda kv: -kv[1]["ms"])]
            section += [f"    {t['ms']:7.3f} ms {t['calls']:5.0f}x  {t['kernel']}" for t in p["top"][:12]]
            print("\n".join(section), flush=True)
            lines += section
            json.dump(res, open(f"{args.out}.json", "w"), indent=1)
    for label in (f"chain {args.steps}", f"tree {args.tree}"):
        if label in res and "plain" in res:
            cycle, plain = res[label], res["plain"]
            lines.append(f"\n{label} / plain: wall {cycle['wall_ms'] / plain['wall_ms']:.2f}, "
                         f"kernel time {cycle['kernel_ms'] / max(plain['kernel_ms'], 1e-9):.2f} (0 on CPU)")
            print(lines[-1])
    open(f"{args.out}.txt", "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
