"""Writing a standard Hugging Face model folder from a GGUF checkpoint, so SGLang, vLLM and
transformers serve the very weights the native engine loads from the GGUF.

float32 by default: gguf and llama.cpp dequantize to float32 (a Q4_1 weight is d * q + m there),
and bf16/f16 would round those values once more. Tied embeddings stay tied (no lm_head.weight).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from models.gguf import find_gguf, gguf_hf_config, gguf_state_dict
from models.safetensors_io import save_state_dict
from models.tokenizer import load_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def export_hf(src: str | Path, out: str | Path, *, dtype: str = "float32") -> Path:
    """Write config.json, generation_config.json, model.safetensors and the tokenizer files
    (with chat_template.jinja) of the GGUF at `src` into the folder `out`."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    file, out = find_gguf(src), Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out}: exists and is not empty")
    config = gguf_hf_config(file) | {"torch_dtype": dtype}
    state = {k: v.to(DTYPES[dtype]) for k, v in gguf_state_dict(file).items()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    save_state_dict(state, out / "model.safetensors")
    os.chmod(out / "model.safetensors", 0o644)  # safetensors writes 0600; a serving container may run as another user
    write_tokenizer(file, out, config["max_position_embeddings"])
    return out


def write_tokenizer(file: Path, out: Path, max_positions: int) -> None:
    """The GGUF's tokenizer in Hugging Face files, readable by transformers 4.x as well as 5.x."""
    tok = load_tokenizer(file)
    tok.save_pretrained(str(out))
    tc = json.loads((out / "tokenizer_config.json").read_text())
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"  # 5.x writes "TokenizersBackend", which 4.x lacks
    tc["model_max_length"] = max_positions
    tc["chat_template"] = tok.chat_template            # also inline, for readers without chat_template.jinja
    (out / "tokenizer_config.json").write_text(json.dumps(tc, indent=2) + "\n")
