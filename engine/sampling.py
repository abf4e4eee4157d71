"""Turn logits into the distributions speculative verification compares.

Greedy rows become one-hot distributions at the argmax, so one rejection-sampling code
path serves greedy and sampled requests: with one-hot p and q it accepts exactly when the
draft equals the target's argmax.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class BatchSampling:
    """Per-row sampling settings as tensors [B]; temperature 0 means greedy."""
    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    generators: list[torch.Generator | None]
    greedy: bool | None = None  # known on the host: saves a device sync per step
    # Per row, or None when no row has one: a LogitsProcessor (engine/logits_processing.py), and
    # how many top logprobs to report (None: no logprobs). Either keeps steps on the host path.
    processors: list | None = None
    logprobs: list[int | None] | None = None

    @classmethod
    def all_greedy_rows(cls, rows: int, device) -> "BatchSampling":
        return cls(torch.zeros(rows, device=device), torch.ones(rows, device=device),
                   torch.zeros(rows, dtype=torch.long, device=device), [None] * rows, greedy=True)

    def rows(self, start: int, stop: int) -> "BatchSampling":
        """Rows start .. stop - 1 as a batch of their own."""
        def part(per_row: list | None) -> list | None:  # None where no row of the part has one
            return None if per_row is None or all(v is None for v in per_row[start:stop]) else per_row[start:stop]
        return BatchSampling(self.temperature[start:stop], self.top_p[start:stop], self.top_k[start:stop],
                             self.generators[start:stop], True if self.greedy else None,
                             part(self.processors), part(self.logprobs))

    @property
    def host_side(self) -> bool:
        """Whether some row needs the host between logits and tokens (processing, logprobs)."""
        return self.processors is not None or self.logprobs is not None

    @property
    def all_greedy(self) -> bool:
        if self.greedy is None:
            self.greedy = bool((self.temperature <= 0).all())
        return self.greedy


def probs_from_logits(logits: torch.Tensor, s: BatchSampling) -> torch.Tensor:
    """logits [B, T, V] -> probabilities [B, T, V] (float32) after temperature, top-k, top-p."""
    logits = logits.float()
    greedy = (s.temperature <= 0) | (s.top_k == 1)
    if s.greedy or bool(greedy.all()):  # known on the host, no device read
        return _one_hot_argmax(logits)
    # An extreme penalty (repetition_penalty 1e-107) or a small temperature can overflow a logit
    # to +inf, and softmax over +inf is NaN: the largest finite value stands in (overflowed
    # logits tie). A temperature past float32's range (1.7e307) is +inf here, and a masked
    # logit (-inf: min_tokens, a grammar) over +inf is NaN: the largest finite temperature stands in.
    big = torch.finfo(logits.dtype).max
    x = (logits / s.temperature.clamp(1e-5, big).view(-1, 1, 1)).clamp(max=big)
    v = x.shape[-1]
    if bool(((s.top_k > 0) & (s.top_k < v)).any()) or bool((s.top_p < 1).any()):
        sorted_x, order = x.sort(dim=-1, descending=True)
        k = torch.where(s.top_k > 0, s.top_k, v).clamp_max(v).view(-1, 1, 1)
        ranks = torch.arange(v, device=x.device)
        sorted_p = sorted_x.softmax(-1)
        before = sorted_p.cumsum(-1) - sorted_p  # probability mass ranked above each token
        drop = (ranks >= k) | (before >= s.top_p.view(-1, 1, 1))  # smallest set reaching top_p, top k
        drop[..., 0] = False  # the top token always stays: a top_p below float32's range (1e-300) is 0.0 here
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(-1, order, sorted_x)
    probs = x.softmax(-1)
    if bool(greedy.any()):
        probs = torch.where(greedy.view(-1, 1, 1), _one_hot_argmax(logits), probs)
    return probs


def _one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token from a 1-D distribution (one-hot rows need no randomness)."""
    if float(probs.max()) >= 1.0:
        return int(probs.argmax())
    return int(torch.multinomial(probs, 1, generator=generator))


def sample_rows(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of probs [B, V], row b drawn with generators[b], with no host read:
    a uniform per row, then inverse-CDF sampling of every row at once (per-row multinomials
    cost a device sync and several kernels each, which dominated sampled steps of a large
    batch on GPU). A row without a generator must be one-hot (greedy): it takes u = 1, which
    lands on its only non-zero token. u lies in (0, 1], so a zero-probability token is never drawn."""
    ones = torch.ones((), device=probs.device)
    u = torch.stack([ones if g is None else 1 - torch.rand((), generator=g, device=probs.device) for g in generators])
    cdf = probs.float().cumsum(-1)
    picks = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1))
    return picks.squeeze(1).clamp_max(probs.shape[-1] - 1)


def uniform(generator: torch.Generator | None, device) -> float:
    return float(torch.rand((), generator=generator, device=device))
