"""Reading a Hugging Face model directory's config.json (no torch, so launch checks stay fast)."""
from __future__ import annotations

import json
from pathlib import Path

from models.gguf import gguf_file, gguf_hf_config


def read_hf_config(path: str | Path) -> dict:
    """config.json of a model directory, or its equivalent for a GGUF checkpoint (models/gguf.py)."""
    if (file := gguf_file(path)) is not None:
        return gguf_hf_config(file)
    p = Path(path) / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: not found (expected a Hugging Face model directory)")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from e
