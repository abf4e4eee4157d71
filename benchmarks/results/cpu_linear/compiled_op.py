"""What calling oneDNN's product from a compiled CPU step costs (session 35): 30 SmolLM2-sized
products (576 -> 1536, one row, float32), chained, timed eager and compiled, through
 - onednn_linear called directly (eager only: dynamo would trace its cache of reordered weights),
 - the engine's op, `specserve::onednn_linear` (torch.library.Library, models/cpu_forms.py),
 - the same function as a torch.library.custom_op,
 - F.linear.
Each the median of 9 rounds of 200 calls, the variants taking turns.

  PYTHONPATH=. .venv/bin/python benchmarks/results/cpu_linear/compiled_op.py --threads 2
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from models.cpu_forms import onednn_linear


@torch.library.custom_op("s35bench::onednn_linear", mutates_args=())
def custom_op(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return onednn_linear(x, weight)


@custom_op.register_fake
def _(x, weight):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    weights = [torch.randn(1536, 576) / 24 for _ in range(30)]

    def chain(product):
        def run(x):
            for w in weights:
                x = product(x, w)[..., :576]
            return x
        return run

    library_op = torch.ops.specserve.onednn_linear
    variants = {
        "onednn_linear, eager": chain(onednn_linear),
        "specserve::onednn_linear (Library), eager": chain(lambda x, w: library_op(x, w, None)),
        "specserve::onednn_linear (Library), compiled": torch.compile(chain(lambda x, w: library_op(x, w, None))),
        "custom_op, compiled": torch.compile(chain(custom_op)),
        "F.linear, eager": chain(F.linear),
        "F.linear, compiled": torch.compile(chain(F.linear)),
    }
    x = torch.randn(1, 1, 576)
    ms = {name: [] for name in variants}
    with torch.no_grad():
        for fn in variants.values():
            for _ in range(5):
                fn(x)
        for _ in range(9):
            for name, fn in variants.items():
                t0 = time.perf_counter()
                for _ in range(200):
                    fn(x)
                ms[name].append((time.perf_counter() - t0) / 200 * 1000)
    base = statistics.median(ms["onednn_linear, eager"])
    print(f"{len(weights)} products 576 -> 1536, one row, float32, {args.threads} threads, {torch.__version__}\n")
    print("| variant | ms per 30 products | us per product over onednn_linear's |\n|---|---|---|")
    for name, runs in ms.items():
        m = statistics.median(runs)
        print(f"| {name} | {m:.3f} | {(m - base) * 1000 / len(weights):+.1f} |")


if __name__ == "__main__":
    main()
