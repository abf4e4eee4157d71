"""Masked grouped-query attention on the GPU: SDPA's `enable_gqa` against query heads folded into
the query length (models/layers.grouped_attention), and what it does to a drafter training step.

On CUDA, `enable_gqa` is served by the flash and math kernels only and flash takes no mask, so
every masked call with fewer KV heads than query heads ran the math kernel (the whole score
matrix in float32). This times both forms side by side in one process, bf16, CUDA events,
medians after warm-up:
  sdpa/<case>   one attention call (forward; forward + backward for the training-time-test shape)
  ttt_step      one `drafter train` step of the SmolLM2 drafter (TTTModel forward + backward, 7
                unroll steps, batch 32 x 512 tokens, random features): the folded form against
                the old one
The memory-efficient kernel is asked for explicitly once per folded case, so a fall back to math
would fail loudly instead of timing the same kernel twice.

  python -m benchmarks.attention_kernels --out benchmarks/results/attention_kernels/h200.json
"""
from __future__ import annotations

import argparse
import functools
import statistics
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import models.layers as layers
from benchmarks.report import md_table, provenance, write_result
from drafter.ttt import TTTModel
from models.eagle3 import Eagle3Config, Eagle3Drafter

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


def cuda_ms(fn, warmup: int = 3, iters: int = 10, rounds: int = 5) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


def sdpa_case(b, h, kvh, t, s, d, backward, fold: bool) -> float:
    dev, dt = torch.device("cuda"), torch.bfloat16
    q = torch.randn(b, h, t, d, device=dev, dtype=dt, requires_grad=backward)
    k = torch.randn(b, kvh, s, d, device=dev, dtype=dt, requires_grad=backward)
    v = torch.randn(b, kvh, s, d, device=dev, dtype=dt, requires_grad=backward)
    mask = torch.rand(1, 1, t, s, device=dev) > 0.2
    mask[..., 0] = True

    def call():
        out = layers.grouped_attention(q, k, v, mask, fold=fold)
        if backward:
            out.sum().backward()
    if fold:
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            call()   # raises if the memory-efficient kernel cannot take the folded call
    return cuda_ms(call)


def ttt_step_ms(fold: bool, batch: int = 32, seq: int = 512) -> float:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    cfg = Eagle3Config(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                       head_dim=64, vocab_size=49152, draft_vocab_size=8192, target_hidden_size=576,
                       aux_layer_ids=[1, 14, 26], rope_theta=100000.0)
    with dev:
        drafter = Eagle3Drafter(cfg)
    model = TTTModel(drafter, 7)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-4, fused=True)
    ids = torch.randint(0, 49152, (batch, seq), device=dev)
    mask = torch.ones(batch, seq, dtype=torch.bool, device=dev)
    aux = torch.randn(batch, seq, 3 * 576, device=dev, dtype=torch.bfloat16)
    p = torch.softmax(torch.randn(batch, seq, 8192, device=dev), -1)
    in_vocab = torch.ones(batch, seq, dtype=torch.bool, device=dev)
    original = layers.grouped_attention
    layers.grouped_attention = functools.partial(original, fold=fold)
    try:
        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss, _ = model(ids, mask, aux, p, in_vocab)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return cuda_ms(step, warmup=2, iters=3, rounds=3)
    finally:
        layers.grouped_attention = original


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
    old, new = ttt_step_ms(fold=False), ttt_step_ms(fold=True)
    result["ttt_step"] = {"enable_gqa_ms": old, "folded_ms": new}
    rows.append(["ttt_step (train step, 32 x 512, 7 steps)", round(old, 2), round(new, 2), round(old / new, 2)])
    print(rows[-1], flush=True)
    md = "Masked grouped-query attention, bf16, medians (ms)\n\n" + md_table(
        ["case", "enable_gqa (math kernel)", "folded (memory-efficient)", "speedup"], rows) + "\n"
    write_result(Path(a.out), result, md)


if __name__ == "__main__":
    main()
