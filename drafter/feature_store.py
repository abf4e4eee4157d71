"""Kept features (`drafter train --keep-features DIR`, reused by `--features DIR`): every
conversation's target features once, for sets small enough to keep on disk.

DIR/features.json says what the shards hold (engine, target, aux layer OUTPUTS, max_length,
dtype, how many of the data's conversations) and whether capture completed; DIR/feat-<k>.safetensors
holds conversations [k * shard_size, (k + 1) * shard_size) in drafter/feature_shards.py's layout.
Unlike the spool, shards are by conversation, not by micro-batch, so a rerun with another batch
size, seed or number of epochs reads the same files. Reads are lazy slices of memory-mapped files.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors import safe_open

from drafter.feature_shards import SeqFeatures, select_aux

INDEX = "features.json"


def shard_path(root: Path, k: int) -> Path:
    return root / f"feat-{k:05d}.safetensors"


def read_index(root: str | Path) -> dict | None:
    p = Path(root) / INDEX
    return json.loads(p.read_text()) if p.is_file() else None


def write_index(root: Path, index: dict) -> None:
    tmp = root / (INDEX + ".tmp")
    tmp.write_text(json.dumps(index, indent=2) + "\n")
    os.replace(tmp, root / INDEX)


class FeatureStore:
    """Random access to kept features by conversation index, as training's Batches ask for them."""

    def __init__(self, root: str | Path, want_outputs: list[int], samples: int):
        self.root = Path(root)
        index = read_index(self.root)
        if index is None:
            raise FileNotFoundError(f"{self.root / INDEX}: no kept features here (capture them with "
                                    f"`drafter train --features ENGINE --keep-features {self.root}`)")
        if not index.get("complete"):
            raise ValueError(f"{self.root}: feature capture did not finish; rerun with --features ENGINE "
                             f"--keep-features {self.root} to complete it")
        if index["samples"] < samples:
            raise ValueError(f"{self.root}: holds features of {index['samples']} conversations, training "
                             f"needs {samples}; capture the rest with --features ENGINE --keep-features {self.root}")
        self.index = index
        self.have = list(index["aux_layer_outputs"])
        self.want = list(want_outputs)
        missing = [w for w in self.want if w not in self.have]
        if missing:
            raise ValueError(f"{self.root}: holds the outputs of layers {self.have}, not {missing} "
                             f"(--aux-layers asks for {self.want})")
        self.size = index["shard_size"]
        self.handles: dict[int, object] = {}
        self.offsets: dict[int, list[int]] = {}

    def _open(self, k: int):
        if k not in self.handles:
            h = safe_open(str(shard_path(self.root, k)), "pt")
            self.handles[k], self.offsets[k] = h, h.get_tensor("offsets").tolist()
        return self.handles[k], self.offsets[k]

    def get(self, i: int) -> SeqFeatures:
        k, r = divmod(i, self.size)
        h, off = self._open(k)
        a, b = off[r], off[r + 1]
        aux = select_aux(h.get_slice("aux")[a:b], self.have, self.want, str(shard_path(self.root, k)))
        return SeqFeatures(i, h.get_slice("input_ids")[a:b].long(), h.get_slice("loss_mask")[a:b].bool(),
                           aux, h.get_slice("last")[a:b])
