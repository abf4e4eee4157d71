"""Reading and writing safetensors weights, single-file or sharded (model.safetensors.index.json)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = [f.name for f in sorted(path.glob("*.safetensors"))]
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors weights found")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        try:
            state.update(load_file(str(path / name)))
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{path / name}: cannot read safetensors file ({e})") from e
    return state


def save_state_dict(state: dict[str, torch.Tensor], file: str | Path) -> None:
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(file))
