"""float32 products of SmolLM2-135M's shapes on CPU, weights cold (30 layers' q/k/v, o, gate/up,
down and the 49152-row lm_head, 540 MB, read once per pass as in a decode step): F.linear
against models.cpu_forms.few_rows_cpu at 1..8 rows (--rows), both in one run, medians of 8 passes.
Since session 33 also oneDNN's linear over weights reordered once beforehand
(torch.ops.mkldnn._reorder_linear_weight, then _linear_pointwise; models.cpu_forms.onednn_linear
since session 34), with its largest difference from F.linear over all shapes.

  OMP_NUM_THREADS=1 python benchmarks/results/cpu_linear/matmul_forms.py --threads 1,2 \
      > benchmarks/results/cpu_linear/matmul_forms.md
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from models.cpu_forms import few_rows_cpu, onednn_linear

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("--rows", default="1,2,3,4,5,6,7,8")
    a = ap.parse_args()
    weights = [torch.randn(o, i) for _ in range(30) for o, i in SHAPES] + [torch.randn(49152, 576)]
    forms = (("F.linear", F.linear), ("few_rows_cpu", few_rows_cpu), ("oneDNN", onednn_linear))
    print("| threads | rows | F.linear ms | few_rows_cpu ms | oneDNN packed ms | F.linear / few_rows_cpu "
          "| F.linear / oneDNN | oneDNN - F.linear, max abs |")
    print("|---|---|---|---|---|---|---|---|")
    for threads in map(int, a.threads.split(",")):
        torch.set_num_threads(threads)
        for n in map(int, a.rows.split(",")):
            xs = {576: torch.randn(n, 576), 1536: torch.randn(n, 1536)}
            diff = max((onednn_linear(xs[w.shape[1]], w) - F.linear(xs[w.shape[1]], w)).abs().max().item()
                       for w in weights)
            ms = {}
            for name, fn in forms:
                times = []
                for _ in range(a.passes + 1):
                    t = time.perf_counter()
                    for w in weights:
                        fn(xs[w.shape[1]], w)
                    times.append((time.perf_counter() - t) * 1e3)
                ms[name] = statistics.median(times[1:])
            print(f"| {threads} | {n} | {ms['F.linear']:.1f} | {ms['few_rows_cpu']:.1f} | {ms['oneDNN']:.1f} | "
                  f"{ms['F.linear'] / ms['few_rows_cpu']:.2f} | {ms['F.linear'] / ms['oneDNN']:.2f} | {diff:.2g} |",
                  flush=True)


if __name__ == "__main__":
    main()
