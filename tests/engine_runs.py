"""A native engine in this process, started, given requests together and shut down: the greedy
token ids it answers (no detokenizing)."""
from __future__ import annotations

import asyncio

from engine.api import SamplingParams


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
