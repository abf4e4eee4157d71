"""A tree's drafting takes the top k of each node's draft-vocabulary logits: session 22's profile
of a compiled 6x8x32 tree cycle (call1/) spent 0.37 of its 1.77 ms in torch.topk's single-block
kernels (51 us for [8 x 8192] -> 8). Is a two-stage top-k faster (engine/draft_tree.py
vocab_topk: the top k of each chunk of `chunk` values, then the top k of those; exact)? Call 6
ran it with the same two stages written out here, before they became vocab_topk. Each variant is
captured as a CUDA graph of 100 calls; median of 20 replays (benchmarks.timing.captured_us).

    PYTHONPATH=. python3 benchmarks/results/h200_s22/topk_bench.py > topk_bench.txt
"""
import torch

from benchmarks.timing import captured_us
from engine.draft_tree import vocab_topk

torch.manual_seed(0)
print(torch.cuda.get_device_name(), torch.__version__)
for shape in ([1, 8192], [1, 8, 8192], [4, 8, 8192], [1, 32000], [1, 8, 32000]):
    x = torch.randn(shape, device="cuda")
    ref_v, ref_i = x.topk(8, dim=-1)
    row = [f"{str(shape):>14} k=8  torch.topk {captured_us(lambda: x.topk(8, dim=-1)):7.1f} us"]
    for chunk in (128, 256, 512, 1024):
        if shape[-1] % chunk:
            continue
        v, i = vocab_topk(x, 8, chunk)
        assert torch.equal(v, ref_v) and torch.equal(x.gather(-1, i), ref_v)
        row.append(f"two-stage/{chunk} {captured_us(lambda: vocab_topk(x, 8, chunk)):6.1f}")
    print("  ".join(row), flush=True)
