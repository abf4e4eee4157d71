"""The native side of benchmarks/vllm_parity.py: the same decoding as its vLLM side, through our
engine's interface (engine.loading.build_engine), in this process.

Greedy, chain drafting with `steps` = vLLM's num_speculative_tokens, prompts one at a time
(batch 1) after one warm-up request; each output in the side-result shape of
benchmarks/vllm_parity_compare.py, with the engine's per-request SpecStats.
"""
from __future__ import annotations

import asyncio
import time
import uuid

import torch

from engine.api import GenerationOutput, SamplingParams
from engine.decoder import SpecConfig
from engine.loading import NativeEngineArgs, build_engine


async def _run(target: str, draft: str, prompts: list[list[int]], steps: int, max_tokens: int, dtype: str) -> dict:
    t0 = time.perf_counter()
    engine = build_engine(NativeEngineArgs(model=target, draft=draft, spec=SpecConfig(steps=steps), device="cpu",
                                           dtype=dtype, max_batch=1))
    await engine.start()
    load_s = time.perf_counter() - t0
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)

    async def generate(ids: list[int]) -> GenerationOutput:
        out = GenerationOutput()
        async for delta in engine.generate(uuid.uuid4().hex, ids, params):
            if delta.error:
                raise RuntimeError(delta.error)
            out = out.then(delta)
        return out

    try:
        await generate(prompts[0])  # warm-up, not counted
        t0 = time.perf_counter()
        outputs = [await generate(ids) for ids in prompts]
        generate_s = time.perf_counter() - t0
    finally:
        await engine.shutdown()
    return {"engine": "native", "version": f"torch {torch.__version__}", "load_s": load_s, "generate_s": generate_s,
            "outputs": [{"token_ids": o.token_ids, "text": o.text, "finish_reason": o.finish_reason,
                         "verify_steps": o.spec.verify_steps, "proposed_draft_tokens": o.spec.proposed_draft_tokens,
                         "accepted_draft_tokens": o.spec.accepted_draft_tokens} for o in outputs]}


def run_native(target: str, draft: str, prompts: list[list[int]], *, steps: int, max_tokens: int,
               dtype: str = "float32") -> dict:
    """Decode `prompts` (token ids) greedily with the native engine; the side-result dict."""
    return asyncio.run(_run(target, draft, prompts, steps, max_tokens, dtype))
