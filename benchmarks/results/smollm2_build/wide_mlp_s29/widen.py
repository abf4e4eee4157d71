"""The shipped drafter with a wider MLP that computes what it computed: its 1,536 units kept, the
new units' gate and up rows drawn as a fresh layer's are, their down_proj columns zero (so they add
nothing until training moves them). A capacity probe on the CPU: fine-tune it as session 28 fine-tuned
the shipped drafter (instruct_s28/), and compare on the held-out sets.

    python benchmarks/results/smollm2_build/wide_mlp_s29/widen.py --draft shipped/smollm2/drafter \
        --intermediate-size 3072 --out runs/s29/wide0
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from models.eagle3 import Eagle3Drafter
from models.eagle3_checkpoint import load_drafter, save_drafter

ap = argparse.ArgumentParser()
ap.add_argument("--draft", required=True)
ap.add_argument("--intermediate-size", type=int, required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--seed", type=int, default=0)
a = ap.parse_args()

torch.manual_seed(a.seed)
old = load_drafter(a.draft, None)
n = old.config.intermediate_size
wide = Eagle3Drafter(dataclasses.replace(old.config, intermediate_size=a.intermediate_size))
state = old.state_dict()
for name, p in wide.state_dict().items():
    if name not in state:
        continue
    if p.shape == state[name].shape:
        p.copy_(state[name])
    elif name.endswith(("gate_proj.weight", "up_proj.weight")):   # [intermediate, hidden]: new rows stay fresh
        p[:n].copy_(state[name])
    elif name.endswith("down_proj.weight"):                        # [hidden, intermediate]: new columns zero
        p.zero_()
        p[:, :n].copy_(state[name])
    else:
        raise ValueError(f"{name}: {tuple(state[name].shape)} -> {tuple(p.shape)}")
extra = json.loads((Path(a.draft) / "config.json").read_text())["specserve"]
save_drafter(wide, a.out, dtype=torch.float32, serving_engine=extra["serving_engine"],
             extra={**extra, "widened_from": a.draft})
x = torch.randn(2, 5, old.config.hidden_size)
gap = (wide.midlayer.mlp(x) - old.midlayer.mlp(x)).abs().max().item()
print(json.dumps({"out": a.out, "intermediate_size": a.intermediate_size, "mlp_max_abs_change": gap}))
