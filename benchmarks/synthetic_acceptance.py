"""Synthetic acceptance, a measuring device: device-side chain steps accept draft j with probability
rates[j-1] (given drafts 1..j-1 were accepted) instead of comparing it with the target's argmax, so a
random-weight target of a real shape runs its real cycle (draft, verify, accept, extend) at a chosen
accept length. The tokens are then meaningless. A benchmark passes it to the decoder
(BatchDecoder.set_acceptance); no engine argument, profile or CLI flag reaches it (as vLLM's
synthetic rejection sampler and SGLANG_SIMULATE_ACC_LEN)."""
from __future__ import annotations

import torch

from engine.acceptance import GreedyAcceptance


class SyntheticAcceptance(GreedyAcceptance):
    """Per-position rates [S] and the uniforms [max_batch, S] a step compares them with, drawn before
    each launch (outside any captured graph or compiled function)."""

    def __init__(self, rates: list[float], spec, max_batch: int, device, seed: int = 0):
        if spec is not None and spec.topk != 1:
            raise ValueError("synthetic acceptance is per chain position: it needs topk = 1")
        if spec is None or len(rates) < spec.steps or not all(0 <= r <= 1 for r in rates):
            steps = spec.steps if spec else 0
            raise ValueError(f"synthetic acceptance needs one rate in [0, 1] per draft step ({steps})")
        self.rates = torch.tensor(rates[:spec.steps], device=device)
        self.uniforms = torch.zeros(max_batch, spec.steps, device=device)
        self.generator = torch.Generator(device).manual_seed(seed)

    def prepare(self) -> None:
        self.uniforms.uniform_(generator=self.generator)

    def chain_matches(self, drafts: torch.Tensor, argmax: torch.Tensor) -> torch.Tensor:
        rows, steps = drafts.shape
        return self.uniforms[:rows, :steps] < self.rates[:steps]
