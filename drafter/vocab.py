"""Draft vocabulary: the N target ids the drafter can propose.

Count token ids where the loss mask is 1 (what the target actually generates), keep the
top N, sort ascending. `d2t[i] = used[i] - i` (draft id -> target id offset) and
`t2d[v] = v in used`, the tensors SGLang and vLLM read from the checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

VOCAB_FILE = "draft_vocab.safetensors"


@dataclass
class DraftVocab:
    used: torch.Tensor    # [N] int64, ascending target ids
    counts: torch.Tensor  # [vocab] int64, loss-masked token counts (for reports)

    @property
    def size(self) -> int:
        return self.used.numel()

    @property
    def d2t(self) -> torch.Tensor:
        return self.used - torch.arange(self.size)

    def t2d(self, vocab_size: int) -> torch.Tensor:
        m = torch.zeros(vocab_size, dtype=torch.bool)
        m[self.used] = True
        return m

    def coverage(self) -> float:
        """Share of loss-masked tokens the draft vocab can express (an upper bound on acceptance)."""
        total = int(self.counts.sum())
        return float(self.counts[self.used].sum()) / total if total else 0.0

    def save(self, path: str | Path) -> None:
        save_file({"used": self.used, "d2t": self.d2t, "t2d": self.t2d(self.counts.numel()),
                   "counts": self.counts}, str(path))

    @classmethod
    def load(cls, path: str | Path) -> "DraftVocab":
        t = load_file(str(path))
        return cls(used=t["used"].long(), counts=t["counts"].long())


def select_vocab(masked_counts: torch.Tensor, all_counts: torch.Tensor, size: int) -> torch.Tensor:
    """Top-`size` ids by loss-masked count; fill with the most frequent ids overall, then the
    lowest unused ids, when fewer than `size` ids were ever generated. Returns ascending ids."""
    vocab = masked_counts.numel()
    size = min(size, vocab)
    seen = int((masked_counts > 0).sum())
    # Count descending, ties by id (stable sort), so the vocab is reproducible.
    chosen = torch.argsort(-masked_counts, stable=True)[:min(size, seen)]
    if chosen.numel() < size:
        rest = torch.ones(vocab, dtype=torch.bool)
        rest[chosen] = False
        rest_ids = rest.nonzero().squeeze(1)
        fill = rest_ids[torch.argsort(-all_counts[rest_ids], stable=True)][:size - chosen.numel()]
        chosen = torch.cat([chosen, fill])
    return chosen.sort().values


def count_tokens(shards, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss-masked counts, all counts) over every token of the sharded data set."""
    masked = torch.zeros(vocab_size, dtype=torch.long)
    total = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in tqdm(shards, desc="count tokens", unit="shard"):
        ids = ids.long()
        total += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
        masked += torch.bincount(ids[mask.bool()], minlength=vocab_size)[:vocab_size]
    return masked, total


def build_vocab(shards, vocab_size: int, size: int) -> DraftVocab:
    masked, total = count_tokens(shards, vocab_size)
    return DraftVocab(used=select_vocab(masked, total, size), counts=masked)
