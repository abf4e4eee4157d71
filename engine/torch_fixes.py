"""Fixes for torch bugs the engine meets, applied only to the torch versions that have them.

Warm starts tune their kernels again (torch < 2.12: pytorch/pytorch#172819, fixed by pytorch/pytorch#173391).
Coordinate-descent tuning (model_runner.COMPILE_OPTIONS) saves each kernel's best launch config in
inductor's cache. The kernels of a loaded saved step (engine/saved_compile.py) are checked against
it in `CachingAutotuner.recheck_autotune_cache`. Before 2.12 that check skips a kernel with a single
config, and it does not carry the "found by coordinate descent" mark over, so such kernels were tuned
again at their first launch: 21.3 of a warm start's 47.2 s on an H100 with torch 2.11. With
`keep_tuned_configs`, which puts 2.12's check in its place, a warm start tunes nothing.
"""
from __future__ import annotations

import logging

import torch
from torch.torch_version import TorchVersion

log = logging.getLogger(__name__)
_applied = False


def keep_tuned_configs() -> None:
    """Make kernels loaded from inductor's cache keep their tuned config (torch < 2.12 only;
    idempotent)."""
    global _applied
    if _applied or TorchVersion(torch.__version__) >= "2.12":
        return
    from torch._dynamo.utils import dynamo_timed
    from torch._inductor.runtime import triton_heuristics as th

    def recheck_autotune_cache(self, reload_kernel_from_src) -> None:
        cached, _, self.autotune_cache_info = th.check_autotune_cache(
            [r.config for r in self.compile_results], self.filename, self.inductor_meta)
        if len(cached) != 1:
            return
        best = cached[0]
        tuned = getattr(best, "found_by_coordesc", False)
        for r in self.compile_results:    # the tuned config is one already compiled: keep it, marked
            if th.triton_config_to_hashable(r.config) == th.triton_config_to_hashable(best):
                r.config.found_by_coordesc = tuned
                self.compile_results = [r]
                return
        if tuned:                         # tuning found another config: compile that one
            with dynamo_timed("CachingAutotuner.slow_precompile_config"):
                if self.fn.fn is None:
                    self.fn = reload_kernel_from_src().fn
                self.compile_results = [self._precompile_config(best)]

    th.CachingAutotuner.recheck_autotune_cache = recheck_autotune_cache
    _applied = True
    log.info("torch %s: kernels from inductor's cache keep their tuned configs (backport of pytorch PR #173391)",
             torch.__version__)
