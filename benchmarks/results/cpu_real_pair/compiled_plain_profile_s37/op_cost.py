"""specserve::onednn_linear's own cost, compiled, against oneDNN's op called directly on a reordered weight (the
floor) and against onednn_linear eager: 30 different 576 -> 1536 weights, one row, float32, 2 threads; the median
of 7 timings of 20 calls, twice (session 37; session 35's compiled_op_s35 compared the op's registrations).

  PYTHONPATH=$PWD python benchmarks/results/cpu_real_pair/compiled_plain_profile_s37/op_cost.py
"""
import statistics
import time

import torch

from models.cpu_forms import REORDER_ROWS, onednn_linear  # importing it registers specserve::onednn_linear

N = 30


def per_product_us(fn, *args) -> float:
    for _ in range(10):
        fn(*args)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(20):
            fn(*args)
        times.append((time.perf_counter() - t0) / 20 / N * 1e6)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(2)
    weights = [torch.randn(1536, 576) for _ in range(N)]
    reordered = [torch.ops.mkldnn._reorder_linear_weight(w, REORDER_ROWS) for w in weights]
    x = torch.randn(1, 576)

    def floor(x):
        return [torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "") for p in reordered]

    def eager(x):
        return [onednn_linear(x, w) for w in weights]

    def op(x, *weights):
        return [torch.ops.specserve.onednn_linear(x, w, None) for w in weights]

    compiled = torch.compile(op)
    with torch.no_grad():
        for _ in range(2):
            print(f"oneDNN's op directly (the floor) {per_product_us(floor, x):.1f} us | onednn_linear eager "
                  f"{per_product_us(eager, x):.1f} us | specserve::onednn_linear compiled "
                  f"{per_product_us(compiled, x, *weights):.1f} us")


if __name__ == "__main__":
    main()
