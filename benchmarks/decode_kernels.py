"""Which kernels should a batch-1 decode step of the 8B shape use? (GEMV and attention variants)

Each variant is timed over 32 layers' worth of distinct tensors inside one CUDA graph, so
nothing is served from L2 and launch gaps are those of a captured step:
  GEMV, per weight matrix of the fused 8B layer: cuBLAS (F.linear), the reduction form that
    `models.layers.Linear` uses under torch.compile (with and without inductor's coordinate
    descent tuning), and torch.compile max-autotune of F.linear; GB/s against copy bandwidth.
  Decode attention, one query token, 32 heads over 8 KV heads: SDPA with a boolean mask
    (what the model runs), SDPA forced to the memory-efficient kernel, written out (matmuls +
    softmax, compiled) and flex_attention (compiled), at the compiled engine's span (1026)
    and at 256.
`--e2e` instead times whole greedy decodes (compiled + overlapped, as the server runs) with
the GEMV reduction off and on and different inductor options, side by side. Writes JSON.

  python -m benchmarks.decode_kernels --out kernels.json
  python -m benchmarks.decode_kernels --e2e cublas,reduce_cdt --out e2e.json
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.h200_decode import copy_bandwidth, cuda_time, engine_kernels, graphed, log, our_decode
from benchmarks.shapes import random_target, weight_bytes
from models.layers import gemv_reduction

LAYERS = 32
GEMV_SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
               "down_proj": (4096, 14336), "lm_head": (128256, 4096)}


def gemv_variants() -> dict:
    import torch._inductor.config as inductor
    variants = {"cublas": F.linear, "reduce": torch.compile(gemv_reduction, dynamic=False),
                "autotune": torch.compile(F.linear, mode="max-autotune-no-cudagraphs", dynamic=False)}

    def cdt(x, w):  # compiled on first call, with coordinate descent tuning on
        return gemv_reduction(x, w)
    cdt_compiled = torch.compile(cdt, dynamic=False)

    def with_cdt(x, w):
        with inductor.patch(coordinate_descent_tuning=True):
            return cdt_compiled(x, w)
    variants["reduce_cdt"] = with_cdt
    return variants


def time_gemvs(bw: float) -> list[dict]:
    rows = []
    for name, (n, k) in GEMV_SHAPES.items():
        copies = 4 if name == "lm_head" else LAYERS
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 64 for _ in range(copies)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x, ws[0]).float()
        nbytes = n * k * 2
        for vname, fn in gemv_variants().items():
            try:
                err = (fn(x, ws[0]).float() - ref).abs().max().item()
                t = cuda_time(graphed(lambda fn=fn: [fn(x, w) for w in ws]), iters=10) / copies
            except Exception as e:  # one variant failing must not lose the others
                rows.append({"matrix": name, "variant": vname, "error": f"{type(e).__name__}: {e}"[:500]})
                log(f"{name} {vname}: {rows[-1]['error'][:200]}")
                continue
            rows.append({"matrix": name, "shape": [n, k], "variant": vname, "us": t * 1e6,
                         "GBps": nbytes / t / 1e9, "fraction_of_copy_bw": nbytes / t / bw, "max_abs_err": err})
            log(f"{name:<13} {vname:<10} {t * 1e6:8.2f} us {nbytes / t / 1e9:6.0f} GB/s "
                f"({100 * nbytes / t / bw:.0f}%) err {err:.2e}")
    return rows


def attn_sdpa(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def attn_efficient(q, k, v, mask):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def attn_written_out(q, k, v, mask):
    b, h, t, d = q.shape
    kvh = k.shape[1]
    qg = q.reshape(b, kvh, h // kvh * t, d)                      # t == 1: query heads grouped by KV head
    s = torch.matmul(qg, k.transpose(-1, -2)).float() / math.sqrt(d)
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1).to(v.dtype)
    return torch.matmul(p, v).reshape(b, h, t, d)


def attn_flex(q, k, v, mask):
    from torch.nn.attention.flex_attention import flex_attention

    def score_mod(score, b, h, qi, kv):
        return torch.where(mask[b, 0, qi, kv], score, -float("inf"))
    return flex_attention(q, k, v, score_mod=score_mod, enable_gqa=True)


def time_attention() -> list[dict]:
    variants = {"sdpa": attn_sdpa, "sdpa_efficient": attn_efficient,
                "written_out_compiled": torch.compile(attn_written_out, dynamic=False),
                "flex_compiled": torch.compile(attn_flex, dynamic=False)}
    rows = []
    for span in (1026, 256):
        q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
        kv = [(torch.randn(1, 8, span, 128, device="cuda", dtype=torch.bfloat16),
               torch.randn(1, 8, span, 128, device="cuda", dtype=torch.bfloat16)) for _ in range(LAYERS)]
        mask = torch.zeros(1, 1, 1, span, dtype=torch.bool, device="cuda")
        mask[..., :160] = True                                   # a 160-token context, as in the decode runs
        ref = attn_sdpa(q, *kv[0], mask).float()
        for vname, fn in variants.items():
            try:
                err = (fn(q, *kv[0], mask).float() - ref).abs().max().item()
                t = cuda_time(graphed(lambda fn=fn: [fn(q, k, v, mask) for k, v in kv]), iters=10) / LAYERS
            except Exception as e:
                rows.append({"span": span, "variant": vname, "error": f"{type(e).__name__}: {e}"[:500]})
                log(f"attention span {span} {vname}: {rows[-1]['error'][:200]}")
                continue
            rows.append({"span": span, "variant": vname, "us_per_layer": t * 1e6, "max_abs_err": err})
            log(f"attention span {span:5d} {vname:<22} {t * 1e6:7.2f} us/layer err {err:.2e}")
    return rows


E2E_VARIANTS = {  # name: (GEMVs as reductions?, inductor options)
    "cublas": (False, {}),
    "reduce": (True, {}),
    "cublas_cdt": (False, {"coordinate_descent_tuning": True}),
    "reduce_cdt": (True, {"coordinate_descent_tuning": True}),
    "reduce_cdt_benchfusion": (True, {"coordinate_descent_tuning": True, "benchmark_fusion": True}),
    "autotune_cdt": (False, {"max_autotune_gemm": True, "coordinate_descent_tuning": True}),
}


def e2e(variants: list[str], out: dict, save, prompt_len: int = 32, new_tokens: int = 128) -> None:
    """Whole greedy decodes per variant, compiled + overlapped; the list twice, alternated."""
    from models.layers import fuse_projections
    target = fuse_projections(random_target("8b", "cuda"))
    out.update(streamed_bytes_per_token=weight_bytes(target), variants={v: E2E_VARIANTS[v] for v in variants})
    for name in variants + variants:  # alternated: a drift of the device shows up as disagreement
        t0 = time.perf_counter()
        with engine_kernels(*E2E_VARIANTS[name]):
            tps = our_decode(target, prompt_len, new_tokens, compile=True, ahead=True)
        out.setdefault(name + "_tok_s", []).append(tps)
        log(f"e2e {name}: {tps:.1f} tok/s (compile+measure {time.perf_counter() - t0:.0f}s)")
        save()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--e2e", nargs="?", const="cublas,reduce_cdt",
                    help="comma-separated variants of %s" % ", ".join(E2E_VARIANTS))
    args = ap.parse_args()
    bw = copy_bandwidth()
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bandwidth_Bps": bw}
    log(f"copy bandwidth {bw / 1e12:.2f} TB/s")

    def save():
        Path(args.out).write_text(json.dumps(res, indent=2))

    with torch.inference_mode():
        if args.e2e:
            variants = args.e2e.split(",")
            e2e(variants, res, save)
            for key in (v for v in variants if v + "_tok_s" in res):
                tps = statistics.median(res[key + "_tok_s"])
                res[key + "_fraction_of_copy_bw"] = tps * res["streamed_bytes_per_token"] / bw
                log(f"{key}: {tps:.1f} tok/s = {100 * res[key + '_fraction_of_copy_bw']:.1f}% of copy bandwidth")
        else:
            res["gemv"] = time_gemvs(bw)
            save()
            res["attention"] = time_attention()
    save()


if __name__ == "__main__":
    main()
