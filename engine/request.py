"""A request as the engine thread holds it, and how new tokens end it.

Stop conditions apply token by token, also inside an accepted draft run: EOS (unless the request
ignores it), its stop token ids, its stop strings (seen by the detokenizer), max_tokens and the
context limit. Each call emits one delta with the verify step that made the tokens: its drafts count
even when the request ends inside the run.
"""
from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Callable

import torch

from engine.api import GenerationOutput, SamplingParams, SpecStats
from engine.detokenizer import IncrementalDetokenizer
from engine.logits_processing import LogitsProcessor
from engine.sampling import BatchSampling


@dataclass
class Request:
    id: str
    prompt: list[int]
    params: SamplingParams
    emit: Callable[[GenerationOutput], None]
    detok: IncrementalDetokenizer | None   # None: the request asked for token ids only
    generator: torch.Generator | None
    spec: SpecStats | None
    output: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    grammar: concurrent.futures.Future | None = None  # the constraint compiling, then compiled
    grammar_deadline: float = 0.0
    processor: LogitsProcessor | None = None

    def consume(self, tokens: list[int], eos_ids: set[int], max_context: int,
                spec_step: SpecStats | None = None, logprobs: list | None = None) -> None:
        """Take new tokens until a stop condition; emit them as one delta."""
        p, new = self.params, []
        for t in tokens:
            self.output.append(t)
            new.append(t)
            if self.processor is not None:
                self.processor.accept(t)
            if not p.ignore_eos and t in eos_ids or t in p.stop_token_ids:
                self.finish_reason = "stop"
                break
            if self.detok is not None:
                self.detok.add(t)
            if self.detok is not None and self.detok.stopped:
                self.finish_reason = "stop"
            elif len(self.output) >= p.max_tokens or len(self.prompt) + len(self.output) >= max_context:
                self.finish_reason = "length"
            if self.finish_reason:
                break
        self.emit(GenerationOutput(
            text=self.detok.take(final=self.finish_reason is not None) if self.detok else "", token_ids=new,
            finish_reason=self.finish_reason, prompt_tokens=len(self.prompt), completion_tokens=len(self.output),
            spec=self.spec if self.finish_reason else None, spec_step=spec_step,
            logprobs=logprobs[:len(new)] if logprobs is not None else None,
        ))


def eos_ids(target, tokenizer) -> set[int]:
    """The ids that end a reply: the target config's EOS ids and the tokenizer's."""
    ids = set(target.config.eos_token_ids)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def batch_sampling(reqs: list[Request], device: torch.device) -> BatchSampling:
    """The sampling settings of `reqs`, one row each, on the decoder's device."""
    return BatchSampling(
        temperature=torch.tensor([0.0 if r.params.greedy else r.params.temperature for r in reqs], device=device),
        top_p=torch.tensor([r.params.top_p for r in reqs], device=device),
        top_k=torch.tensor([r.params.top_k for r in reqs], device=device),
        generators=[r.generator for r in reqs],
        greedy=all(r.params.greedy for r in reqs),
        processors=[r.processor for r in reqs] if any(r.processor for r in reqs) else None,
        logprobs=[r.params.logprobs for r in reqs] if any(r.params.logprobs is not None for r in reqs) else None,
    )
