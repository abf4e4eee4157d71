"""Share of the target's greedy answer tokens that the shipped drafter's draft vocabulary holds,
on the three held-out sets (CPU float32, 256 tokens, replies to EOS). A token outside it can never
be drafted, so the share caps acceptance at every position.

  .venv/bin/python benchmarks/results/smollm2_build/build_s18/vocab_coverage.py runs/smollm2-hf
"""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
from benchmarks.engine_load import load_prompts, run_load  # noqa: E402
from engine.loading import NativeEngineArgs, build_engine  # noqa: E402

t2d = load_file(ROOT / "shipped/smollm2/drafter/model.safetensors")["t2d"].bool()
engine = build_engine(NativeEngineArgs(model=sys.argv[1], device="cpu", dtype="float32", max_batch=16))
engine.start_blocking()
out = {}
for name in ("chat", "humaneval", "completion"):
    prompts = load_prompts(ROOT / f"shipped/smollm2/heldout/{name}.jsonl", engine.tokenizer, 10**6)
    tokens = torch.tensor([t for r in run_load(engine, prompts, 16, 256).outputs for t in r])
    out[name] = {"prompts": len(prompts), "tokens": len(tokens),
                 "in_draft_vocab": round(t2d[tokens].float().mean().item(), 4)}
    print(name, out[name], flush=True)
engine.stop_blocking()
(Path(__file__).parent / "vocab_coverage.json").write_text(json.dumps(out, indent=1) + "\n")
