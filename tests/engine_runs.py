"""The native engine run greedily in this process: a decoder stepped directly (`decode`), or an
engine started, given requests together and shut down (`greedy_ids`); token ids, no detokenizing."""
from __future__ import annotations

import asyncio

from engine.api import SamplingParams
from engine.decoder import BatchDecoder
from engine.sampling import BatchSampling


def greedy(rows: int = 1) -> BatchSampling:
    return BatchSampling.all_greedy_rows(rows, "cpu")


def decode(target, drafter, spec, prompts: list[list[int]], n: int = 40, fast: bool = True,
           batched_prefill: bool = False, prefill_graphs: bool = False):
    """Greedy-decode all prompts in one batch; returns (outputs, accepted-per-step lists).

    fast: the device-side greedy step (engine/spec_worker.py); else the host step that
    also serves sampling. batched_prefill: all prompts in one (padded) prefill.
    prefill_graphs: each prompt padded to its graph width (on CPU nothing is captured).
    """
    dec = BatchDecoder(target, drafter, spec, max_batch=len(prompts), max_context=512, fast_greedy=fast,
                       prefill_graphs=prefill_graphs)
    if batched_prefill:
        outs = [[t] for t in dec.prefill_batch(0, prompts, greedy(len(prompts)))]
    else:
        outs = [[dec.prefill(i, p, greedy())] for i, p in enumerate(prompts)]
    accepted = [[] for _ in prompts]
    while min(len(o) for o in outs) < n:
        for i, r in enumerate(dec.step(len(prompts), greedy(len(prompts)))):
            outs[i] += r.tokens
            accepted[i].append(r.accepted)
    return [o[:n] for o in outs], accepted


def greedy_ids(engine, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    async def one(i, prompt):
        ids = []
        async for out in engine.generate(f"r{i}", prompt, SamplingParams(temperature=0, max_tokens=max_tokens[i],
                                                                         ignore_eos=True, detokenize=False)):
            assert out.text == ""
            ids += out.token_ids
        return ids

    async def go():
        await engine.start()
        try:
            return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        finally:
            await engine.shutdown()
    return asyncio.run(go())
