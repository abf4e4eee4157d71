"""Host time of one eager masked attention call (the engine's layers.Attention call: bool mask,
GQA) per SDPA backend, for shapes an engine meets once (each call a new width) and shapes it
repeats. Session 23's profile of the engine thread found ~2 ms per eager attention call on the
H200; cuDNN builds an execution plan per new shape.

  python benchmarks/results/h200_s23/sdpa_host.py
"""
import contextlib
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def call_ms(b: int, t: int, span: int) -> float:
    """SmolLM2's attention: 9 query heads, 3 KV heads, head dim 64; host ms of one call, then synced."""
    q = torch.randn(b, 9, t, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, 3, span, 64, device="cuda", dtype=torch.bfloat16)
    mask = torch.ones(b, 1, t, span, dtype=torch.bool, device="cuda").tril(span - t)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    F.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True)
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return 1e3 * host


backends = {"default order": None, "cudnn": [SDPBackend.CUDNN_ATTENTION], "efficient": [SDPBackend.EFFICIENT_ATTENTION],
            "flash": [SDPBackend.FLASH_ATTENTION], "math": [SDPBackend.MATH],
            "no cudnn": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]}
call_ms(1, 8, 256)  # CUDA context, kernels loaded
for n, (name, order) in enumerate(backends.items()):
    try:
        with sdpa_kernel(order) if order else contextlib.nullcontext():
            shapes = [(2, 40 + 20 * n + i) for i in range(12)] + [(16, 16 + 10 * n + i) for i in range(8)]
            new = [call_ms(b, t, 512) for b, t in shapes]
            again = [call_ms(16, 16, 512) for _ in range(20)]
        print(f"{name:>14}: new shapes median {statistics.median(new):7.3f} ms (max {max(new):7.3f}), "
              f"a repeated shape median {statistics.median(again):7.3f} ms", flush=True)
    except RuntimeError as e:
        print(f"{name:>14}: {str(e).splitlines()[0][:100]}")
