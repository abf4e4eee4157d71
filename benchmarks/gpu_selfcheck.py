"""On a GPU: the CUDA-graph greedy steps give the same tokens as the eager general path.

Random tiny models (bf16 and fp32), plain and chain-speculative decoding, batch 1 and 3
(padded to 4 rows in the graphs); torch.compile (fp32) for plain decoding at batch 1 and the
3-step chain at batch 1.
Prints one line per case and exits non-zero on a mismatch. Not a test (CI has no GPU).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.decoder import BatchDecoder, SpecConfig  # noqa: E402
from engine.sampling import BatchSampling  # noqa: E402
from models.eagle3 import Eagle3Config, Eagle3Drafter  # noqa: E402
from models.llama import LlamaConfig, LlamaModel  # noqa: E402

# (steps, batch) also run compiled, fp32, at batch 1: there one-token GEMVs are Triton reductions
# (models.layers.Linear). Compiling takes about two minutes per case with the
# engine's inductor options.
COMPILED_CASES = {(None, 1), (3, 1)}


def build(dtype):
    torch.manual_seed(0)
    with torch.device("cuda"):
        t = LlamaModel(LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32), [0, 1, 2])
        for p in t.parameters():
            p.data.normal_(0, 0.3)
        d = Eagle3Drafter(Eagle3Config(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=32, vocab_size=512, draft_vocab_size=512,
                                       target_hidden_size=128, aux_layer_ids=[0, 1, 2]))
    d.embed_tokens.weight = t.embed_tokens.weight
    d.t2d.fill_(True)
    return t.to(dtype).eval(), d.to(dtype).eval()


def decode(t, d, spec, prompts, fast, n=48, compile=False):
    dec = BatchDecoder(t, d if spec else None, spec, 4, 512, fast_greedy=fast, compile=compile)
    g = lambda b: BatchSampling.all_greedy_rows(b, "cuda")  # noqa: E731
    outs = [[dec.prefill(i, p, g(1))] for i, p in enumerate(prompts)]
    while min(map(len, outs)) < n:
        for i, r in enumerate(dec.step(len(prompts), g(len(prompts)))):
            outs[i] += r.tokens
    return [o[:n] for o in outs]


def main() -> int:
    bad = 0
    prompts = [[5, 6, 7], list(range(20, 60)), [9] * 11]
    for dtype in (torch.float32, torch.bfloat16):
        t, d = build(dtype)
        with torch.inference_mode():
            for spec in (None, SpecConfig(1), SpecConfig(3)):
                for ps in (prompts[:1], prompts):
                    a, b = decode(t, d, spec, ps, True), decode(t, d, spec, ps, False)
                    compiled = dtype == torch.float32 and ((spec and spec.steps), len(ps)) in COMPILED_CASES
                    c = decode(t, d, spec, ps, True, compile=True) if compiled else a
                    bad += not (a == b == c)
                    print(f"{dtype} spec={spec and spec.steps} batch={len(ps)} graphs==eager: {a == b} "
                          f"compiled==eager: {c == b if compiled else '-'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
