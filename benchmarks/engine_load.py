"""Load on the native engine in this process: the loop the server runs (engine/scheduler.py),
without HTTP, at a chosen concurrency.

`run_load` keeps `concurrency` greedy requests in flight until every prompt has been served
and measures what a serving benchmark does: output throughput (all new tokens / wall time),
each request's decode rate ((tokens - 1) / (end - first token)), the longest gap between a
request's deltas (a compile or a graph capture inside serving shows here), and accept length
(completion tokens / verify steps). Replies end at EOS unless ignore_eos. The tokens are kept,
so settings can be checked against each other: greedy decoding must not change any.
"""
from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass

from engine.api import SamplingParams
from engine.scheduler import NativeEngine


@dataclass
class LoadResult:
    concurrency: int
    wall_s: float
    output_tokens: int
    throughput: float               # new tokens / s, all requests
    request_tok_s: float            # median over requests of (tokens - 1) / decode seconds
    accept_length: float            # completion tokens / verify steps (1.0 without speculation)
    max_gap_s: float                # longest wait between two deltas of one request
    outputs: list[list[int]]        # per prompt, in prompt order

    def record(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "outputs"}


async def _serve(engine: NativeEngine, prompts: list[list[int]], concurrency: int, max_tokens: int,
                 ignore_eos: bool) -> LoadResult:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos, detokenize=False)
    gate = asyncio.Semaphore(concurrency)
    outputs: list[list[int]] = [[] for _ in prompts]
    rates, gaps, steps, completions = [], [0.0], [], []

    async def one(i: int, prompt: list[int]) -> None:
        async with gate:
            first = last = None
            async for out in engine.generate(f"load-{i}", prompt, params):
                if out.error:
                    raise RuntimeError(f"request {i} failed: {out.error}")
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
                outputs[i] += out.token_ids
                if out.finished:
                    completions.append(out.completion_tokens)
                    steps.append(out.spec.verify_steps if out.spec else 0)
            if len(outputs[i]) > 1 and last > first:
                rates.append((len(outputs[i]) - 1) / (last - first))

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    wall = time.perf_counter() - t0
    total = sum(len(o) for o in outputs)
    # The engine's convention (SpecStats.accept_length): completion tokens / verify steps.
    accept = sum(completions) / sum(steps) if engine.decoder.spec and sum(steps) else 1.0
    return LoadResult(concurrency, wall, total, total / wall, statistics.median(rates) if rates else 0.0,
                      accept, max(gaps), outputs)


def run_load(engine: NativeEngine, prompts: list[list[int]], concurrency: int, max_tokens: int,
             ignore_eos: bool = False) -> LoadResult:
    """Serve `prompts` through a started engine with `concurrency` requests in flight."""
    return asyncio.run(_serve(engine, prompts, concurrency, max_tokens, ignore_eos))
