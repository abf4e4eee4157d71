"""Reading and writing safetensors weights, single-file or sharded (model.safetensors.index.json)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for file in weight_files(path):
        try:
            state.update(load_file(str(file)))
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{file}: cannot read safetensors file ({e})") from e
    return state


_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
                "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint directory (from the shard index when there is one)."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{index}: not a safetensors index with a weight_map ({e})") from None
        return [path / name for name in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors weights found")
    return files


def check_safetensors(file: str | Path) -> list[str]:
    """Validate a safetensors file from its header alone (no tensor is read): the header parses
    and every tensor's byte range lies inside the file and fits its dtype and shape. Catches
    truncated downloads and partial copies at start-up. Returns the tensors' names; raises
    ValueError naming the file and the tensor."""
    file = Path(file)
    if not file.is_file():
        raise FileNotFoundError(f"{file}: missing weights file")
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            raise ValueError(f"{file}: not a safetensors file or truncated (header length {n}, file size {size})")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise ValueError(f"{file}: corrupt safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file}: corrupt safetensors header (not a JSON object)")
    data = size - 8 - n
    names = []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = t["data_offsets"]
            expected = _DTYPE_BYTES.get(t["dtype"])
            for dim in t["shape"]:
                expected = expected * dim if expected is not None else None
        except (TypeError, KeyError, ValueError) as e:
            raise ValueError(f"{file}: tensor {name!r}: corrupt header entry ({e!r})") from None
        if end > data:
            raise ValueError(f"{file}: tensor {name!r} ends at byte {end} of the data, but the file holds only "
                             f"{data} data bytes: the file is truncated")
        if expected is not None and end - begin != expected:
            raise ValueError(f"{file}: tensor {name!r}: {end - begin} bytes for dtype {t['dtype']} shape "
                             f"{t['shape']} (expected {expected})")
        names.append(name)
    return names


def save_state_dict(state: dict[str, torch.Tensor], file: str | Path) -> None:
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(file))
