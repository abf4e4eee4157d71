"""Where a one-token step and a verify step part in bfloat16: the same position's numbers, op by op.

Greedy speculation repeats plain decoding only if the target's logits for a position come out the
same from a one-token step and from row 0 of a (k+1)-token verify step. This compares them bit for
bit on the SmolLM2 shape (random weights, eager, bf16): each product of the model at row counts
1..40 against its first row in a larger product; attention for one query against the first of
k+1 under each SDPA backend and written out; and whole layers, three ways: a one-token step, a
verify step, and a one-token step padded with k masked tokens to the verify step's width.

    python -m benchmarks.gpu.bf16_rows --out runs/bf16_rows.json
"""
from __future__ import annotations

import argparse
import contextlib
import json

import torch
import torch.nn.functional as F

from benchmarks.shapes import TARGETS, random_target
from engine.masks import block_inputs, causal, one_token_inputs
from models.kernel_plan import KernelPlan
from models.layers import fuse_projections, set_kernel_plan, written_out_attention


def same(a: torch.Tensor, b: torch.Tensor) -> dict:
    d = (a.float() - b.float()).abs()
    return {"equal": bool(torch.equal(a, b)), "max_abs_diff": float(d.max())}


def products(model, device, dtype, rows=(1, 2, 4, 5, 8, 10, 16, 20, 32, 40)) -> list[dict]:
    """Row 0 of F.linear over M rows against F.linear over row 0 alone, for each weight shape."""
    out, seen = [], set()
    for name, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        if not isinstance(mod, torch.nn.Linear) or w is None or tuple(w.shape) in seen:
            continue
        seen.add(tuple(w.shape))
        x = torch.randn(max(rows), w.shape[1], device=device, dtype=dtype)
        one = F.linear(x[:1], w)
        out.append({"weight": name, "shape": list(w.shape),
                    "by_rows": {m: same(F.linear(x[:m], w)[:1], one) for m in rows}})
    return out


def backends():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    yield "default", contextlib.nullcontext()
    for name in ("MATH", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "FLASH_ATTENTION"):
        if hasattr(SDPBackend, name):
            yield name.lower(), sdpa_kernel(getattr(SDPBackend, name))


def attention(config, device, dtype, k: int, span: int, prefix: int) -> dict:
    """Query 0 of k+1 against one query, over the same keys (the block's later keys masked)."""
    h, kvh, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    q = torch.randn(1, h, k + 1, d, device=device, dtype=dtype)
    kk, vv = (torch.randn(1, kvh, span, d, device=device, dtype=dtype) for _ in range(2))
    base = torch.tensor([prefix], device=device)
    m1 = one_token_inputs(base, span).mask
    mk = block_inputs(base, causal(1, k + 1, device), torch.arange(k + 1, device=device).view(1, -1), span).mask
    res = {}
    for name, ctx in backends():
        try:
            with ctx:
                a = F.scaled_dot_product_attention(q[:, :, :1], kk, vv, attn_mask=m1, enable_gqa=True)
                b = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mk, enable_gqa=True)[:, :, :1]
            res[name] = same(a, b)
        except RuntimeError as e:  # a backend that cannot take this input
            res[name] = {"error": str(e).splitlines()[0][:160]}
    a = written_out_attention(q[:, :, :1], kk, vv, m1)
    b = written_out_attention(q, kk, vv, mk)[:, :, :1]
    res["written_out"] = same(a, b)
    return res


def layers(model, device, k: int, span: int, prefix: int, seed: int = 0) -> dict:
    """Every layer's output for position `prefix`: one-token step, verify row 0, padded step row 0."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, prefix), generator=g).to(device)
    block = torch.randint(0, vocab, (1, k + 1), generator=g).to(device)
    model(prompt, block_inputs(torch.zeros(1, dtype=torch.long, device=device), causal(1, prefix, device),
                               torch.arange(prefix, device=device).view(1, -1), span))
    captured: list[torch.Tensor] = []
    hooks = [layer.register_forward_hook(lambda _m, _i, o: captured.append(o[:, :1].clone()))
             for layer in model.layers]
    base = torch.tensor([prefix], device=device)
    depth = torch.arange(k + 1, device=device).view(1, -1)
    # one block mask for verify and padded: the padded step's extra tokens come after row 0, which
    # sees only itself and the prefix either way
    runs = {}
    for name, tokens, inputs in (
            ("one_token", block[:, :1], one_token_inputs(base, span)),
            ("verify", block, block_inputs(base, causal(1, k + 1, device), depth, span)),
            ("padded", torch.cat([block[:, :1], torch.zeros_like(block[:, 1:])], 1),
             block_inputs(base, causal(1, k + 1, device), depth, span))):
        captured.clear()
        logits = model(tokens, inputs).logits[:, :1]
        runs[name] = [*captured, logits]
    for hk in hooks:
        hk.remove()
    names = [f"layer {i}" for i in range(len(model.layers))] + ["logits"]

    def first_part(a, b):
        for n, x, y in zip(names, runs[a], runs[b]):
            if not torch.equal(x, y):
                return n
        return None
    return {"one_token_vs_verify": first_part("one_token", "verify"),
            "padded_vs_verify": first_part("padded", "verify"),
            "argmax": {n: int(runs[n][-1].argmax()) for n in runs},
            "max_abs_logit_diff": {"one_token_vs_verify": same(runs["one_token"][-1], runs["verify"][-1]),
                                   "padded_vs_verify": same(runs["padded"][-1], runs["verify"][-1])}}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--k", type=int, default=4, help="draft tokens in the verify step")
    ap.add_argument("--prefix", type=int, default=200)
    ap.add_argument("--span", type=int, default=512)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    dtype = getattr(torch, a.dtype)
    model = fuse_projections(random_target("smollm2", a.device, dtype))
    model.setup_cache(1, a.span)
    result = {"device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
              "torch": torch.__version__, "dtype": a.dtype, "k": a.k,
              "products": products(model, a.device, dtype),
              "attention": attention(TARGETS["smollm2"], a.device, dtype, a.k, a.span, a.prefix)}
    with torch.no_grad():
        for form in ("sdpa", "written_out"):
            set_kernel_plan(KernelPlan(attention=form), model)
            for name, ctx in backends() if form == "sdpa" else [("-", contextlib.nullcontext())]:
                with ctx:
                    try:
                        result[f"layers {form} {name}"] = layers(model, a.device, a.k, a.span, a.prefix)
                    except RuntimeError as e:
                        result[f"layers {form} {name}"] = {"error": str(e).splitlines()[0][:160]}
    for p in result["products"]:
        bad = [m for m, r in p["by_rows"].items() if not r["equal"]]
        print(f"product {p['weight']:40s} {str(p['shape']):14s} row 0 differs at M = {bad or 'none'}")
    for name, r in result["attention"].items():
        print(f"attention {name:22s} {r}")
    for key in [k for k in result if k.startswith("layers")]:
        print(f"{key:32s} {result[key]}")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(result, fh, indent=1)
    return result


if __name__ == "__main__":
    main()
