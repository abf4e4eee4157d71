"""Masked grouped-query attention on the GPU: SDPA's `enable_gqa` against query heads folded into
the query length.

On CUDA, `enable_gqa` is served by the flash and math kernels only and flash takes no mask, so
every masked call with fewer KV heads than query heads (decode, verification, the drafter's
training-time test) runs the math kernel. Folding the query heads that share a KV head into the
query length makes it plain attention, which the memory-efficient kernel serves without copying
K or V. This times both side by side in one process, bf16, CUDA events, medians after warm-up,
one attention call per case (forward; forward + backward for the training-time-test shapes).
The memory-efficient kernel is asked for explicitly once per folded case, so a fall back to math
would fail loudly instead of timing the same kernel twice.

Measured on the H200 (results/attention_kernels/h200.md, run at commit 568ec64, when the engine
carried the fold and this also timed a whole training step both ways: 70.4 against 70.1 ms): the
math kernel wins at decode and verify shapes (the fold takes 1.15-2.3x as long) and ties in the
training-time test, so the engine keeps `enable_gqa`.

  python -m benchmarks.attention_kernels --out benchmarks/results/attention_kernels/h200.json
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.report import md_table, provenance, write_result
from benchmarks.timing import eager_cuda_ms

# name: (batch, heads, kv_heads, queries, keys, head_dim, backward)
CASES = {
    "llama8b_verify4_ctx1k": (1, 32, 8, 4, 1024, 128, False),
    "llama8b_verify4_ctx4k": (1, 32, 8, 4, 4096, 128, False),
    "llama8b_decode_b32_ctx1k": (32, 32, 8, 1, 1024, 128, False),
    "smollm2_verify4_ctx1k": (1, 9, 3, 4, 1024, 64, False),
    "smollm2_decode_b32_ctx1k": (32, 9, 3, 1, 1024, 64, False),
    "smollm2_ttt_step6_t512": (32, 9, 3, 512, 7 * 512, 64, True),
    "smollm2_ttt_step6_t509": (32, 9, 3, 509, 7 * 509, 64, True),   # key length not a multiple of 8
}


def folded_attention(q, k, v, mask):
    """q [B, H, T, D], k/v [B, KVH, S, D], mask [1, 1, T, S]: row gi * T + ti of the folded query is
    head j * g + gi, query ti."""
    b, h, t, d = q.shape
    kvh = k.shape[1]
    g = h // kvh
    out = F.scaled_dot_product_attention(q.reshape(b, kvh, g * t, d), k, v, attn_mask=mask.repeat(1, 1, g, 1))
    return out.reshape(b, h, t, d)


def sdpa_case(b, h, kvh, t, s, d, backward, fold: bool) -> float:
    dev, dt = torch.device("cuda"), torch.bfloat16
    q = torch.randn(b, h, t, d, device=dev, dtype=dt, requires_grad=backward)
    k = torch.randn(b, kvh, s, d, device=dev, dtype=dt, requires_grad=backward)
    v = torch.randn(b, kvh, s, d, device=dev, dtype=dt, requires_grad=backward)
    mask = torch.rand(1, 1, t, s, device=dev) > 0.2
    mask[..., 0] = True

    def call():
        out = (folded_attention(q, k, v, mask) if fold else
               F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))
        if backward:
            out.sum().backward()
    if fold:
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            call()   # raises if the memory-efficient kernel cannot take the folded call
    return eager_cuda_ms(call)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="result JSON (a .md beside it)")
    a = ap.parse_args()
    rows, result = [], {"provenance": provenance(), "device": torch.cuda.get_device_name(), "sdpa": {}}
    for name, case in CASES.items():
        try:
            gqa, folded = sdpa_case(*case, fold=False), sdpa_case(*case, fold=True)
        except RuntimeError as e:
            result["sdpa"][name] = {"shape": case, "error": str(e)[:500]}
            print(name, "error:", str(e)[:300], flush=True)
            continue
        result["sdpa"][name] = {"shape": case, "enable_gqa_ms": gqa, "folded_ms": folded}
        rows.append([name, round(gqa, 4), round(folded, 4), round(gqa / folded, 2)])
        print(rows[-1], flush=True)
    md = "Masked grouped-query attention, bf16, medians (ms)\n\n" + md_table(
        ["case", "enable_gqa (math kernel)", "folded (memory-efficient)", "speedup"], rows) + "\n"
    write_result(Path(a.out), result, md)


if __name__ == "__main__":
    main()
