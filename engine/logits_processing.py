"""Per-request logits processing, in one place: repetition, frequency and presence penalties,
logit bias, min_tokens and the grammar mask (structured outputs).

The decoder calls `apply` wherever the target's logits choose a token: at prefill, in a plain
step and at every node of a verify forward. Each node continues the committed output plus the
drafts on its path from the root, and everything here is a function of that token history:
penalty counts include the path's drafts position by position, and the grammar matcher is
advanced along the path, then rolled back. So a verified node is processed exactly as a plain
step would process the same history: greedy speculation gives the plain greedy tokens, and
rejection sampling keeps the processed distribution. Committed tokens enter the state only
through `accept` (the scheduler calls it as it emits them); `draft_mask` lets the drafter
propose only grammar-valid tokens, so drafts are not wasted on tokens the mask would reject.
"""
from __future__ import annotations

import logging

import torch

from engine.api import SamplingParams
from engine.grammar import Grammars, allowed

log = logging.getLogger("specserve.engine")


class LogitsProcessor:
    def __init__(self, params: SamplingParams, prompt: list[int], vocab_size: int, device,
                 stop_ids: list[int], grammars: Grammars | None = None, compiled=None):
        self.p, self.vocab, self.device = params, vocab_size, device
        self.penalized = bool(params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0)
        self.counts = torch.zeros(vocab_size, device=device)          # output tokens, for presence/frequency
        self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)  # prompt and output, for repetition
        self.seen[torch.tensor([t for t in prompt if 0 <= t < vocab_size], dtype=torch.long, device=device)] = True
        self.bias = None
        bias = {t: b for t, b in params.logit_bias.items() if 0 <= t < vocab_size}  # the server checked ids
        if bias:
            self.bias = torch.zeros(vocab_size, device=device)
            self.bias[torch.tensor(list(bias), dtype=torch.long, device=device)] = torch.tensor(list(bias.values()),
                                                                                                device=device)
        # An id outside the vocabulary can never be emitted, so it needs no blocking (and cannot index).
        stops = {i for i in set(stop_ids) | set(params.stop_token_ids) if 0 <= i < vocab_size}
        self.stop_ids = torch.tensor(sorted(stops), dtype=torch.long, device=device)
        self.emitted = 0
        self.grammars = grammars
        self.matcher = grammars.matcher(compiled) if compiled is not None else None
        self._bitmask = None
        self.banned = None  # tokens no output may hold (control characters in JSON)
        if compiled is not None and params.constraint.kind in ("json_object", "json_schema"):
            self.banned = grammars.control_tokens.to(device)

    def accept(self, token: int) -> None:
        """A committed output token."""
        self.emitted += 1
        if self.penalized:
            self.counts[token] += 1
            self.seen[token] = True
        if self.matcher is not None and not self.matcher.is_terminated() and not self.matcher.accept_token(token):
            log.warning("token %d broke the grammar it was masked by", token)

    def apply(self, logits: torch.Tensor, paths: list[list[int]]) -> torch.Tensor:
        """logits [N, V] at N nodes, node i continuing the output with paths[i] (node 0: []) ->
        processed float32 logits [N, V]."""
        x = logits.float().clone()
        n, p = len(paths), self.p
        if self.penalized:
            counts = self.counts.expand(n, -1).clone()
            rows = [i for i, path in enumerate(paths) for _ in path]
            if rows:
                toks = torch.tensor([t for path in paths for t in path], device=x.device)
                counts.index_put_((torch.tensor(rows, device=x.device), toks), torch.ones(len(rows), device=x.device),
                                  accumulate=True)
            if p.repetition_penalty != 1.0:
                seen = self.seen | (counts > 0)
                x = torch.where(seen, torch.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty), x)
            x -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
        if self.bias is not None:
            x += self.bias
        if p.min_tokens:
            short = torch.tensor([self.emitted + len(path) < p.min_tokens for path in paths], device=x.device)
            x[:, self.stop_ids] = x[:, self.stop_ids].masked_fill(short.unsqueeze(1), float("-inf"))
        if self.matcher is not None:
            self.grammars.apply(x, self._fill(paths))
        if self.banned is not None:
            x[:, self.banned] = float("-inf")
        return x

    def draft_mask(self, path: list[int]) -> torch.Tensor | None:
        """Target-vocabulary tokens [V] the grammar allows after the output plus `path` (None: all)."""
        if self.matcher is None:
            return None
        mask = allowed(self._fill([path])[0], self.vocab).to(self.device)
        if self.banned is not None:
            mask[self.banned] = False
        return mask

    def _fill(self, paths: list[list[int]]) -> torch.Tensor:
        """The grammar's bitmask after each path. A node whose path the grammar refuses keeps
        everything allowed: its parent's mask excludes its token, so it is never accepted."""
        if self._bitmask is None or self._bitmask.shape[0] < len(paths):
            self._bitmask = self.grammars.bitmask(max(len(paths), 8))
        mask, m = self._bitmask[:len(paths)], self.matcher
        mask.fill_(-1)
        walked: list[int] = []  # tokens accepted beyond the committed output
        for i, path in enumerate(paths):
            common = 0
            while common < min(len(walked), len(path)) and walked[common] == path[common]:
                common += 1
            if len(walked) > common:
                m.rollback(len(walked) - common)
                del walked[common:]
            ok = True
            for t in path[common:]:
                if m.is_terminated() or not m.accept_token(t):
                    ok = False
                    break
                walked.append(t)
            if ok and not m.is_terminated():
                m.fill_next_token_bitmask(mask, i)
        if walked:
            m.rollback(len(walked))
        return mask
