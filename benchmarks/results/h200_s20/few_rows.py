"""How fast a verify's few-row products read the weights, compiled: cuBLAS (F.linear) against
the reduction laid out [out, rows] (`few_rows_reduction` below), next to the one-token
GEMV a plain decode step runs (models.layers.gemv_reduction).

For each shape, every layer's q/k/v, o, gate/up and down products in one compiled function
(random bf16 weights, one tensor per layer as in the model, so the L2 cache holds none of it),
and the lm_head alone; compiled with the engine's options, captured as a CUDA graph, median of
rounds of replays. Reported as GB/s of weights read and as time against one row.

    python3 benchmarks/results/h200_s20/few_rows.py --out few_rows.json
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from benchmarks.shapes import TARGETS
from benchmarks.timing import time_ms
from engine.decoder import COMPILE_OPTIONS
from models.layers import gemv_reduction

ROWS = {"8b": [1, 4, 8], "smollm2": [1, 5]}


def few_rows_reduction(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear for a few input rows as one multiply-and-sum in fp32, laid out [out, rows], in the
    hope that the rows of one output share each weight load (measured: they do not; session 20
    took it out of models.layers.Linear)."""
    rows = x.reshape(-1, x.shape[-1])
    y = (weight.float().unsqueeze(1) * rows.float().unsqueeze(0)).sum(-1).t()
    return y.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])


def shapes(name: str, layers: int | None) -> dict[str, list[tuple[int, int]]]:
    c = TARGETS[name]
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    layer = [(q + 2 * kv, c.hidden_size), (c.hidden_size, q), (2 * c.intermediate_size, c.hidden_size),
             (c.hidden_size, c.intermediate_size)]
    return {"layers": layer * (layers or c.num_hidden_layers), "lm_head": [(c.vocab_size, c.hidden_size)]}


def product(kind: str, rows: int):
    if kind == "cublas":
        return F.linear
    return gemv_reduction if rows == 1 else few_rows_reduction


def measure(name: str, dev: torch.device, iters: int, layers: int | None) -> list[dict]:
    out = []
    gen = torch.Generator(dev).manual_seed(0)
    for part, mats in shapes(name, layers).items():
        weights = [torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=gen) * 0.02 for n, k in mats]
        gb = sum(w.numel() * 2 for w in weights) / 1e9
        for rows in ROWS[name]:
            xs = {k: torch.randn(1, rows, k, device=dev, dtype=torch.bfloat16, generator=gen)
                  for k in {k for _, k in mats}}
            results = {}
            for kind in ("cublas", "reduction"):
                f = product(kind, rows)
                torch._dynamo.reset()  # one lambda, many compiles: call 2's last hit dynamo's recompile limit
                fn = torch.compile(lambda f=f, ws=weights: [f(xs[w.shape[1]], w) for w in ws],
                                   options=dict(COMPILE_OPTIONS))
                ms = time_ms(fn, dev, iters)
                results[kind] = fn()
                out.append({"shape": name, "part": part, "rows": rows, "kind": kind, "ms": ms, "gb": gb,
                            "gb_per_s": gb / ms * 1e3})
                print(f"{name:8s} {part:8s} rows {rows}  {kind:9s} {ms:8.3f} ms  {gb / ms * 1e3:7.0f} GB/s", flush=True)
            diff = max((a.float() - b.float()).abs().max().item()
                       for a, b in zip(results["cublas"], results["reduction"]))
            out[-1]["max_abs_diff_vs_cublas"] = diff
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="smollm2,8b")
    ap.add_argument("--layers", type=int, help="layers per timed function (default: all; each product is tuned "
                    "and compiled on its own, so all of SmolLM2's 30 took minutes)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    with torch.inference_mode():
        for name in args.shapes.split(","):
            rows += measure(name, dev, args.iters, args.layers)
            json.dump({"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "rows": rows},
                      open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
