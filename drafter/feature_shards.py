"""Feature shards: target hidden states of whole sequences in one safetensors file, the unit the
capture engines write and training reads (drafter/spool.py online, drafter/feature_store.py kept).

Per shard, the sequences back to back: `aux` [N, n_aux, H] (the aux layer OUTPUTS, in the order
of the `aux_layer_outputs` metadata), `last` [N, H] (the last decoder layer's output before the
final norm: the target's next-token distribution is recomputed from it with the final norm and
lm_head, so nothing vocabulary-sized is stored), `input_ids` int32 [N], `loss_mask` uint8 [N],
`offsets` int64 [n + 1] and `sample` int64 [n] (index into the data's TokenShards). Features
keep the dtype they were captured in. Files appear by rename, so a reader never sees half of one.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


@dataclass
class SeqFeatures:
    sample: int
    input_ids: torch.Tensor   # [T] long
    loss_mask: torch.Tensor   # [T] bool
    aux: torch.Tensor         # [T, n_aux, H]
    last: torch.Tensor        # [T, H]


def shard_bytes(tokens: int, n_aux: int, hidden: int, dtype: torch.dtype) -> int:
    """Size of a shard holding `tokens` positions (its few small tensors and header rounded up)."""
    return tokens * ((n_aux + 1) * hidden * dtype.itemsize + 5) + 4096


def write_shard(path: Path, seqs: list[SeqFeatures], meta: dict) -> int:
    """Write atomically (tmp + rename); returns the file's size, taken before the rename because
    a spool consumer may take (and delete) the shard the moment it appears."""
    lengths = torch.tensor([s.input_ids.numel() for s in seqs], dtype=torch.int64)
    offsets = torch.zeros(len(seqs) + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    tensors = {
        "aux": torch.cat([s.aux for s in seqs]).contiguous(),
        "last": torch.cat([s.last for s in seqs]).contiguous(),
        "input_ids": torch.cat([s.input_ids for s in seqs]).to(torch.int32),
        "loss_mask": torch.cat([s.loss_mask for s in seqs]).to(torch.uint8),
        "offsets": offsets,
        "sample": torch.tensor([s.sample for s in seqs], dtype=torch.int64),
    }
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={k: json.dumps(v) for k, v in meta.items()})
    size = tmp.stat().st_size
    os.replace(tmp, path)
    return size


def read_meta(path: Path) -> dict:
    with safe_open(str(path), "pt") as f:
        return {k: json.loads(v) for k, v in (f.metadata() or {}).items()}


def split(t: dict[str, torch.Tensor]) -> list[SeqFeatures]:
    off = t["offsets"].tolist()
    return [SeqFeatures(int(s), t["input_ids"][a:b].long(), t["loss_mask"][a:b].bool(), t["aux"][a:b], t["last"][a:b])
            for s, a, b in zip(t["sample"].tolist(), off[:-1], off[1:])]


def read_shard(path: Path) -> tuple[list[SeqFeatures], dict]:
    return split(load_file(str(path))), read_meta(path)


def select_aux(seqs_aux: torch.Tensor, have: list[int], want: list[int], source: str) -> torch.Tensor:
    """The `want` layer outputs out of features holding `have` ([..., len(have), H] -> [..., len(want), H])."""
    missing = [w for w in want if w not in have]
    if missing:
        raise ValueError(f"{source}: holds the outputs of layers {have}, not {missing} (training wants {want}); "
                         f"capture them again with these --aux-layers")
    return seqs_aux[..., [have.index(w) for w in want], :]


def collate(seqs: list[SeqFeatures], dtype: torch.dtype | None = None):
    """Right-padded batch: ids, mask [B, T]; aux [B, T, n_aux * H]; last [B, T, H]. Padding sits
    after every real token, so causal attention and the TTT loss never read it."""
    t = max(s.input_ids.numel() for s in seqs)
    n, h = seqs[0].aux.shape[1:]
    dtype = dtype or seqs[0].aux.dtype
    ids = torch.zeros(len(seqs), t, dtype=torch.long)
    mask = torch.zeros(len(seqs), t, dtype=torch.bool)
    aux = torch.zeros(len(seqs), t, n * h, dtype=dtype)
    last = torch.zeros(len(seqs), t, h, dtype=dtype)
    for b, s in enumerate(seqs):
        k = s.input_ids.numel()
        ids[b, :k], mask[b, :k] = s.input_ids, s.loss_mask
        aux[b, :k], last[b, :k] = s.aux.reshape(k, n * h), s.last
    return ids, mask, aux, last
