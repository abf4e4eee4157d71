"""Where one `drafter train` step's time goes with the target in the loop (features native): the
SmolLM2 shape with random weights, bf16 autocast, CUDA events, medians. Parts: the target's forward
with aux capture and full-vocabulary logits, the draft-vocabulary distribution (target_draft_probs),
and the drafter's training-time-test forward + backward + optimizer step.

  python -m benchmarks.train_step_parts --out benchmarks/results/attention_kernels/train_step_h200.json
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.report import md_table, provenance, write_result
from benchmarks.shapes import random_drafter, random_target
from benchmarks.timing import eager_cuda_ms
from drafter.ttt import TTTModel, target_draft_probs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dev = torch.device("cuda")
    target = random_target("smollm2", dev, torch.bfloat16)
    target.aux_layer_ids = [1, 14, 26]
    target.requires_grad_(False)
    drafter = random_drafter(target, "smollm2")
    for name, param in drafter.named_parameters():   # as drafter train holds it: float32, the embedding shared
        if name != "embed_tokens.weight":
            param.data = param.data.float()
            param.requires_grad_(True)
    model = TTTModel(drafter, 7)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-4, fused=True)
    used = torch.nonzero(drafter.t2d).flatten()
    rows, result = [], {"provenance": provenance(), "device": torch.cuda.get_device_name(), "parts": {}}
    for batch, seq in ((32, 512), (32, 1024)):
        ids = torch.randint(0, 49152, (batch, seq), device=dev)
        mask = torch.ones(batch, seq, dtype=torch.bool, device=dev)
        amp = torch.autocast("cuda", dtype=torch.bfloat16)

        def fwd():
            with torch.no_grad(), amp:
                return target(ids, capture_aux=True)

        out = fwd()

        def probs():
            with torch.no_grad(), amp:
                return target_draft_probs(out.logits, used, drafter.t2d)

        p, in_vocab = probs()

        def ttt():
            with amp:
                loss, _ = model(ids, mask, out.aux_hidden, p, in_vocab)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        def host_copy():
            ids.cpu().to(dev, non_blocking=True)

        parts = {"target_forward": eager_cuda_ms(fwd, iters=3, rounds=3),
                 "draft_probs": eager_cuda_ms(probs, iters=3, rounds=3),
                 "ttt_fwd_bwd_opt": eager_cuda_ms(ttt, warmup=2, iters=3, rounds=3),
                 "ids_round_trip": eager_cuda_ms(host_copy)}
        result["parts"][f"{batch}x{seq}"] = parts
        rows += [[f"{batch}x{seq}", k, round(v, 2)] for k, v in parts.items()]
        print(rows[-4:], flush=True)
    write_result(Path(a.out), result, "One drafter training step by part, bf16 (ms)\n\n"
                 + md_table(["batch x tokens", "part", "ms"], rows) + "\n")


if __name__ == "__main__":
    main()
