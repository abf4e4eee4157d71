"""Would a deeper shipped target reach 2x? A prediction from kernel counts (CPU) and the
measured GPU profile of the shipped pair.

The shipped pair is bound by kernel count on an H200 (benchmarks/decode_profile.py: a plain
step is 368 kernels in 0.57 ms, a 3-step chain cycle 675 in 1.13 ms), so a step costs its
kernels times the time per kernel. Kernels are counted here, on any machine, as the ATen
operations an engine step dispatches that launch work (views excluded); for the shipped pair
that count (358 / 636 / 808 for plain / chain 3 / chain 5) is within 5% of the profile's.
Each extra target layer adds the same operations whatever its width, so for a target of L
layers (the shipped config with num_hidden_layers = L, its one-layer drafter unchanged):

  step_ms(L) = profiled step_ms + (ops(L) - ops(shipped)) x profiled ms per kernel of that step
  speedup(S, L) = a(S) x plain_ms(L) / chain_ms(S, L)

with a(S), tokens per verify, from a measured sweep of the shipped pair (a deeper target with
the same drafter quality is the assumption). At L = 8 this reproduces the measured CUDA-graph
speedups; everything else is a PREDICTION, not a measurement.

The committed prediction is for the first shipped pair (8 layers, commit 30d2cae; the shipped
target is now the 32-layer one it led to, and benchmarks/results/README.md compares the two):
  git worktree add /tmp/first 30d2cae
  python -m benchmarks.depth_prediction --model /tmp/first/shipped/target --draft /tmp/first/shipped/drafter \\
      --profile benchmarks/results/h200_run4/call3/profile/pair_profile.json \\
      --sweep benchmarks/results/h200_run2/call3/step_sweep/h200-native.json \\
      --out-dir benchmarks/results/depth_prediction
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.decode_profile import label_steps
from benchmarks.report import md_table, provenance, write_json
from engine.decoder import BatchDecoder, SpecConfig
from engine.greedy_cycle import chain_greedy, plain_greedy
from engine.sampling import BatchSampling

# ATen operations that launch no kernel (metadata and views).
NO_KERNEL = {"view", "_unsafe_view", "slice", "unsqueeze", "squeeze", "expand", "t", "transpose", "select",
             "permute", "as_strided", "alias", "detach", "reshape", "_reshape_alias", "split", "unbind", "narrow",
             "lift_fresh", "empty", "empty_like", "empty_strided", "split_with_sizes"}


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func.__name__.split(".")[0] not in NO_KERNEL
        return func(*args, **(kwargs or {}))


def step_ops(target, drafter, steps: int) -> int:
    """ATen kernel-launching ops of one device-side engine step (0 steps: plain decode)."""
    dec = BatchDecoder(target, drafter if steps else None, SpecConfig(steps) if steps else None, 1, 512,
                       cuda_graphs=False)
    dec.prefill(0, list(range(10, 40)), BatchSampling.all_greedy_rows(1, "cpu"))
    with torch.inference_mode(), _CountOps() as count:
        (chain_greedy if steps else plain_greedy)(dec, 1, 256)
    return count.n


def deeper(target, drafter, layers: int):
    """`target`'s config with `layers` layers, random weights (counts do not depend on them),
    capturing the aux layers `drafter` reads."""
    from benchmarks.shapes import random_target
    from models.layers import fuse_projections

    t = random_target(dataclasses.replace(target.config, num_hidden_layers=layers), "cpu",
                      target.embed_tokens.weight.dtype)
    t.aux_layer_ids = list(drafter.config.aux_layer_ids)
    return fuse_projections(t)


def predict(profile: dict, sweep: dict, depths: list[int], model: str, draft: str) -> dict:
    from engine.loading import NativeEngineArgs, load_models

    target, drafter, _ = load_models(NativeEngineArgs(model=model, draft=draft, spec=SpecConfig(1), device="cpu"))
    measured = {label_steps(k.removeprefix("graphs_only ")): v for k, v in profile.items()
                if k.startswith("graphs_only ")}
    chains = sorted(s for s in measured if s)
    accept = {r["steps"]: r["tokens_per_step"] for r in sweep["rows"] if r["topk"] <= 1}
    base_layers = target.config.num_hidden_layers
    base_ops = {s: step_ops(target, drafter, s) for s in measured}
    rows = []
    for layers in depths:
        t = target if layers == base_layers else deeper(target, drafter, layers)
        ops = base_ops if layers == base_layers else {s: step_ops(t, drafter, s) for s in measured}
        ms = {s: m["kernel_ms_per_step"] + (ops[s] - base_ops[s]) * m["kernel_ms_per_step"] / m["kernels_per_step"]
              for s, m in measured.items()}
        for s in chains:
            rows.append({"layers": layers, "steps": s, "ops_plain": ops[0], "ops_chain": ops[s],
                         "plain_ms": ms[0], "chain_ms": ms[s], "accept": accept[s],
                         "speedup": accept[s] * ms[0] / ms[s]})
    measured_speedup = {r["steps"]: r["speedup"] for r in sweep["rows"] if r["topk"] <= 1}
    return {"model": model, "draft": draft, "base_layers": base_layers,
            "profiled_kernels": {s: m["kernels_per_step"] for s, m in measured.items()}, "counted_ops": base_ops,
            "measured_speedup_at_base": {s: measured_speedup[s] for s in chains}, "rows": rows}


def markdown(r: dict) -> str:
    rows = [[x["layers"], x["steps"], x["ops_plain"], x["ops_chain"], x["plain_ms"], x["chain_ms"], x["accept"],
             x["speedup"]] for x in r["rows"]]
    return (f"# Depth prediction: {r['model']} + {r['draft']}\n\n`{r['provenance']['command']}`\n\n"
            f"Kernels per step, profiled on the GPU / counted here as ATen ops: "
            + ", ".join(f"{'plain' if s == 0 else f'chain {s}'} {r['profiled_kernels'][s]:.0f} / {r['counted_ops'][s]}"
                        for s in r["counted_ops"])
            + f". Measured CUDA-graph speedups of the {r['base_layers']}-layer pair: "
            + ", ".join(f"chain {s} {v:.2f}x" for s, v in r["measured_speedup_at_base"].items())
            + ".\n\nPREDICTION (CUDA graphs, same drafter and acceptance; not a measurement):\n\n"
            + md_table(["target layers", "steps", "ops plain", "ops chain", "plain ms", "chain ms",
                        "tokens / verify", "predicted speedup"], rows))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True, help="decode_profile.py --model ... --modes graphs_only JSON")
    ap.add_argument("--sweep", required=True, help="step_sweep JSON of the same pair (CUDA graphs)")
    ap.add_argument("--model", required=True, help="the profiled pair's target")
    ap.add_argument("--draft", required=True)
    ap.add_argument("--depths", default="8,16,24,32,48")
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    result = predict(json.loads(Path(args.profile).read_text()), json.loads(Path(args.sweep).read_text()),
                     [int(n) for n in args.depths.split(",")], args.model, args.draft)
    result["provenance"] = provenance(argv)
    out = Path(args.out_dir)
    write_json(out / "depth_prediction.json", result)
    text = markdown(result)
    (out / "depth_prediction.md").write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
