"""`drafter export`: a training checkpoint -> the SGLang/vLLM EAGLE-3 checkpoint directory.

Writes through models.eagle3_checkpoint.save_drafter, which records the target layer
OUTPUTS training captured (and, from the run, the engine that captured them: native,
transformers or vllm) and puts in `eagle_aux_hidden_state_layer_ids` the ids that make
the chosen serving engine capture those same tensors (models.aux_layers.serving_ids_for).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from drafter.train import CKPT_DIR, WEIGHTS, latest_checkpoint
from models.eagle3 import Eagle3Config, Eagle3Drafter
from models.eagle3_checkpoint import save_drafter
from models.hf_config import read_hf_config

SERVING_ENGINES = ("sglang-llama", "sglang-deepseek", "vllm")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def export(run_dir: str | Path, out_dir: str | Path, *, step: int | None = None,
           serving_engine: str = "sglang-llama", dtype: str = "bfloat16") -> Path:
    run = Path(run_dir)
    if serving_engine not in SERVING_ENGINES:
        raise ValueError(f"--serving-engine {serving_engine!r}: choose one of {', '.join(SERVING_ENGINES)}")
    ckpt = run / CKPT_DIR / f"step-{step:08d}" if step is not None else latest_checkpoint(run)
    if ckpt is None or not (ckpt / WEIGHTS).exists():
        raise FileNotFoundError(f"{run}: no checkpoint{'' if step is None else f' for step {step}'}")
    cfg = Eagle3Config(**json.loads((run / "drafter_config.json").read_text()))
    train_cfg = json.loads((run / "train_config.json").read_text())
    with torch.device("meta"):
        d = Eagle3Drafter(cfg)   # the embedding (and a shared head) stay on meta: the target's, never saved
    missing, unexpected = d.load_state_dict(load_file(str(ckpt / WEIGHTS)), strict=False, assign=True)
    borrowed = {"embed_tokens.weight"} | ({"lm_head.weight"} if cfg.shared_head else set())   # the target's
    if set(missing) != borrowed or unexpected:
        raise ValueError(f"{ckpt / WEIGHTS}: missing {missing}, unexpected {unexpected}")
    extra = train_cfg.get("extra") or {}
    target_layers = extra.get("target_num_hidden_layers")
    if target_layers is None:
        target_layers = read_hf_config(train_cfg["target"]).get("num_hidden_layers")
    trained_step = int(ckpt.name.split("-")[1])
    save_drafter(d, out_dir, dtype=DTYPES[dtype], serving_engine=serving_engine,
                 extra={"target_num_hidden_layers": target_layers, "trained_steps": trained_step,
                        "capture_engine": extra.get("capture_engine", "native"),
                        "ttt_length": train_cfg.get("ttt_length"), "target": str(train_cfg["target"])})
    return Path(out_dir)
