"""Deterministic micro-batches over the tokenized conversations (drafter/shards.py).

Epoch e shuffles the first n conversations with seed + e; micro-batch g of the whole run is
batch g % per_epoch of epoch g // per_epoch. Training and a capture process that feeds it build
the same Batches from the same settings, so a resumed run, and the features captured for it,
see the same data in the same order.
"""
from __future__ import annotations

import torch

from drafter.shards import TokenShards


class Batches:
    def __init__(self, data: TokenShards, batch_size: int, max_length: int, seed: int, limit: int = 0):
        self.data, self.bs, self.max_length, self.seed = data, batch_size, max_length, seed
        self.n = min(len(data), limit) if limit else len(data)  # the first n conversations (data scaling)
        self.per_epoch = self.n // batch_size
        if self.per_epoch == 0:
            raise ValueError(f"{self.n} conversations cannot fill one batch of {batch_size}")
        self._perm_epoch, self._perm = -1, None

    def indices(self, g: int) -> tuple[list[int], int]:
        """Conversation indices of micro-batch g, and its epoch."""
        epoch, j = divmod(g, self.per_epoch)
        if epoch != self._perm_epoch:
            gen = torch.Generator().manual_seed(self.seed + epoch)
            self._perm, self._perm_epoch = torch.randperm(self.n, generator=gen), epoch
        return [int(i) for i in self._perm[j * self.bs:(j + 1) * self.bs]], epoch

    def sequence(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Conversation i cut to max_length: (input_ids, loss_mask)."""
        ids, m = self.data[i]
        return ids[:self.max_length], m[:self.max_length]

    def length(self, i: int) -> int:
        """Tokens of conversation i as cut (what a capture engine computes features for)."""
        return min(self.max_length, self.data[i][0].numel())

    def get(self, g: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Micro-batch g right-padded: ids, mask [B, T], and its epoch."""
        idx, epoch = self.indices(g)
        items = [self.sequence(i) for i in idx]
        t = max(ids.numel() for ids, _ in items)
        ids = torch.zeros(len(items), t, dtype=torch.long)
        mask = torch.zeros(len(items), t, dtype=torch.bool)
        for b, (x, m) in enumerate(items):
            ids[b, :x.numel()], mask[b, :m.numel()] = x, m
        return ids, mask, epoch
