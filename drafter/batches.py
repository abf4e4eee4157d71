"""Deterministic micro-batches over the tokenized conversations (drafter/shards.py).

Epoch e shuffles the first n conversations with seed + e; micro-batch g of the whole run is
batch g % per_epoch of epoch g // per_epoch. Training and a capture process that feeds it build
the same Batches from the same settings, so a resumed run, and the features captured for it,
see the same data in the same order.

Length grouping (`group` > 1, HF Trainer's group_by_length): each run of `group` batches of the
shuffled order is sorted by length before it is cut into batches, and the epoch's batches are
shuffled again. A batch is right-padded to its longest conversation, and the TTT unroll's
attention grows with the square of that length, so batches of alike lengths train on the same
tokens for a fraction of the padding and attention (random batches of answers that run to
1,024 tokens averaged under half of that).
"""
from __future__ import annotations

import torch

from drafter.shards import TokenShards


class Batches:
    def __init__(self, data: TokenShards, batch_size: int, max_length: int, seed: int, limit: int = 0,
                 group: int = 1):
        self.data, self.bs, self.max_length, self.seed, self.group = data, batch_size, max_length, seed, group
        self.n = min(len(data), limit) if limit else len(data)  # the first n conversations (data scaling)
        self.per_epoch = self.n // batch_size
        if self.per_epoch == 0:
            raise ValueError(f"{self.n} conversations cannot fill one batch of {batch_size}")
        self._order_epoch, self._order = -1, None
        self._lengths: torch.Tensor | None = None

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        """[per_epoch, batch_size] conversation indices of epoch `epoch`."""
        gen = torch.Generator().manual_seed(self.seed + epoch)
        perm = torch.randperm(self.n, generator=gen)[:self.per_epoch * self.bs]
        if self.group <= 1:
            return perm.view(self.per_epoch, self.bs)
        if self._lengths is None:
            self._lengths = torch.tensor([self.length(i) for i in range(self.n)])
        pool = self.group * self.bs
        runs = [p[self._lengths[p].argsort(stable=True)] for p in perm.split(pool)]
        batches = torch.cat(runs).view(self.per_epoch, self.bs)
        return batches[torch.randperm(self.per_epoch, generator=gen)]

    def indices(self, g: int) -> tuple[list[int], int]:
        """Conversation indices of micro-batch g, and its epoch."""
        epoch, j = divmod(g, self.per_epoch)
        if epoch != self._order_epoch:
            self._order, self._order_epoch = self._epoch_order(epoch), epoch
        return [int(i) for i in self._order[j]], epoch

    def sequence(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Conversation i cut to max_length: (input_ids, loss_mask)."""
        ids, m = self.data[i]
        return ids[:self.max_length], m[:self.max_length]

    def length(self, i: int) -> int:
        """Tokens of conversation i as cut (what a capture engine computes features for)."""
        return min(self.max_length, self.data.length(i))

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
