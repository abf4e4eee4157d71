"""engine/torch_fixes.py changes torch only where the bug is: this CPU build is 2.13, where kernels
from inductor's cache keep their tuned configs already (the backport acts on torch 2.11, on a GPU)."""
import torch
from torch._inductor.runtime import triton_heuristics

from engine.torch_fixes import keep_tuned_configs


def test_the_backport_leaves_torch_2_12_and_later_alone():
    assert torch.torch_version.TorchVersion(torch.__version__) >= "2.12"
    before = triton_heuristics.CachingAutotuner.recheck_autotune_cache
    keep_tuned_configs()
    assert triton_heuristics.CachingAutotuner.recheck_autotune_cache is before
