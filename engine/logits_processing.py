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

from engine.api import SamplingParams, TokenLogprob
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


def process_rows(logits: torch.Tensor, processors: list | None, paths) -> torch.Tensor:
    """logits [B, N, V] -> each row's processed logits; paths[b][i]: the drafts on node i's path."""
    if processors is None:
        return logits
    return torch.stack([logits[b].float() if proc is None else proc.apply(logits[b], paths[b])
                        for b, proc in enumerate(processors)])


def draft_masks(drafter, processors: list | None):
    """`allowed` for engine/draft_tree.draft_chain: each grammar row's mask over the draft
    vocabulary after the drafts so far (None: no row has a grammar)."""
    if processors is None or all(p is None or p.matcher is None for p in processors):
        return None
    device = drafter.fc.weight.device
    ids = drafter.draft_to_target(torch.arange(drafter.config.draft_vocab_size, device=device))
    free = torch.ones(ids.shape[0], dtype=torch.bool, device=device)

    def mask_after(drafts: list[torch.Tensor]) -> torch.Tensor:
        paths = torch.stack(drafts, 1).tolist() if drafts else [[] for _ in processors]
        rows = [free if p is None or p.matcher is None else p.draft_mask(path)[ids]
                for p, path in zip(processors, paths)]
        mask = torch.stack(rows)
        mask[~mask.any(-1)] = True  # the grammar allows nothing in the draft vocabulary: draft freely
        return mask
    return mask_after


def token_logprobs(logits: torch.Tensor, ks: list[int | None] | None,
                   picks: list[list[tuple[int, int]]]) -> list[list[TokenLogprob] | None]:
    """picks[b]: (node, token) of each token row b emitted; the raw target logits [B, N, V] at
    that node give its logprob and the top ks[b]."""
    if ks is None:
        return [None] * len(picks)
    want = [(b, node, tok) for b, k in enumerate(ks) if k is not None for node, tok in picks[b]]
    b_idx, n_idx, t_idx = (torch.tensor(c, device=logits.device) for c in zip(*want))
    lp = logits[b_idx, n_idx].float().log_softmax(-1)
    chosen = lp.gather(1, t_idx.unsqueeze(1))[:, 0].tolist()
    kmax = max(k for k in ks if k is not None)
    top_v, top_i = lp.topk(kmax, dim=-1) if kmax else (lp[:, :0], lp[:, :0].long())
    top_v, top_i = top_v.tolist(), top_i.tolist()
    out: list[list[TokenLogprob] | None] = [None if k is None else [] for k in ks]
    for j, (b, _, _) in enumerate(want):
        k = ks[b]
        out[b].append(TokenLogprob(chosen[j], tuple(zip(top_i[j][:k], top_v[j][:k]))))
    return out
