"""Reading a Hugging Face model directory's config.json (no torch, so launch checks stay fast)."""
from __future__ import annotations

import json
from pathlib import Path


def read_hf_config(path: str | Path) -> dict:
    p = Path(path) / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: not found (expected a Hugging Face model directory)")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from e
