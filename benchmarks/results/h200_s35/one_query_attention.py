"""GPU time of SmolLM2's attention at one query (a decode step) and five (a 4-step verify), per kernel.

Call F showed cuDNN's flash kernel taking 23.6% of a compiled plain step's GPU time (6.9 us in each of
30 layers). This times the same call, bf16, 9 query heads over 3 KV heads of 64, masked by position as
the engine masks, in each form that takes it:
- SDPA with enable_gqa as the engine calls it, dispatched freely and pinned to each backend;
- KV heads repeated (flash and memory-efficient kernels take no GQA);
- the math written out and compiled.

Each form is captured 200 times in one CUDA graph, and the graph's replay time over 200 is the
figure (benchmarks.timing.captured_us): GPU time without launch costs, as in the engine's captured steps,
the median of 20 replays. (The call G that ran this had the same function inline.)

  python3 benchmarks/results/h200_s35/one_query_attention.py --out $OUT/one_query_attention.json
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.timing import captured_us

HEADS, KV_HEADS, DIM, CALLS = 9, 3, 64, 200


def written_out(q, k, v, mask):
    """Attention as matmuls, the query heads that share a KV head folded into the query length."""
    b, h, n, d = q.shape
    g = h // k.shape[1]
    qf = q.reshape(b, k.shape[1], g * n, d)
    s = (qf @ k.transpose(-1, -2)).float() * d ** -0.5
    s = s.masked_fill(~mask.repeat(1, 1, g, 1), float("-inf"))
    return (s.softmax(-1).to(q.dtype) @ v).reshape(b, h, n, d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    compiled = torch.compile(written_out, dynamic=False)
    rows = []
    for queries in (1, 5):
        for keys in (256, 512):
            q = torch.randn(1, HEADS, queries, DIM, device=dev, dtype=dt)
            k = torch.randn(1, KV_HEADS, keys, DIM, device=dev, dtype=dt)
            v = torch.randn_like(k)
            filled = keys // 2 + queries           # the context in use: half the span
            pos = torch.arange(keys, device=dev)
            mask = (pos.view(1, 1, 1, -1) <= (filled - queries + torch.arange(queries, device=dev)).view(1, 1, -1, 1))
            kr, vr = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
            def gqa():   # as the engine calls it
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

            forms = {
                "sdpa gqa, free": (None, gqa),
                "sdpa gqa, cudnn": (SDPBackend.CUDNN_ATTENTION, gqa),
                "sdpa gqa, math": (SDPBackend.MATH, gqa),
                "sdpa repeated kv, cudnn": (SDPBackend.CUDNN_ATTENTION,
                                            lambda: F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask)),
                "sdpa repeated kv, efficient": (SDPBackend.EFFICIENT_ATTENTION,
                                                lambda: F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask)),
                "sdpa repeated kv, flash, no mask": (SDPBackend.FLASH_ATTENTION,
                                                     lambda: F.scaled_dot_product_attention(q, kr[:, :, :filled],
                                                                                            vr[:, :, :filled])),
                "written out, compiled": (None, lambda: compiled(q, k, v, mask)),
            }
            for name, (backend, fn) in forms.items():
                try:
                    if backend is None:
                        us = captured_us(fn, CALLS)
                    else:
                        with sdpa_kernel(backend):
                            us = captured_us(fn, CALLS)
                    row = {"queries": queries, "keys": keys, "form": name, "us": round(us, 2)}
                except Exception as e:  # noqa: BLE001 - a backend that refuses the call is a result too
                    row = {"queries": queries, "keys": keys, "form": name, "error": f"{type(e).__name__}: {e}"[:200]}
                rows.append(row)
                print(row, flush=True)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("\n| queries | keys | form | us per call |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['queries']} | {r['keys']} | {r['form']} | {r.get('us', r.get('error'))} |")


if __name__ == "__main__":
    main()
