"""benchmarks/depth_prediction.py counts kernel-launching ops per engine step: every target
layer adds the same count to a plain step and to a chain cycle, so a deeper target changes
both by the same amount (the premise of its prediction); views launch nothing."""
import torch

from benchmarks.depth_prediction import deeper, step_ops
from benchmarks.shapes import random_drafter, random_target
from models.layers import fuse_projections


def test_each_layer_adds_the_same_ops_to_plain_and_chain_steps():
    target = fuse_projections(random_target("tiny", "cpu", torch.float32))
    drafter = fuse_projections(random_drafter(target, "tiny"))
    counts = {n: (step_ops(t, drafter, 0), step_ops(t, drafter, 3))
              for n, t in ((4, target), (6, deeper(target, drafter, 6)), (8, deeper(target, drafter, 8)))}
    per_layer = (counts[6][0] - counts[4][0]) / 2
    assert per_layer > 10
    for n in (6, 8):
        assert counts[n][0] - counts[4][0] == counts[n][1] - counts[4][1] == per_layer * (n - 4)
    assert counts[4][1] > counts[4][0]  # drafting, verify, extend and accept cost kernels of their own
