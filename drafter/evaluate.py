"""`drafter eval`: accept length and per-position acceptance on held-out prompts, through the
native engine in this process, greedy, at each requested step count (chain, topk 1). Chat
prompts go through the chat template; raw prompts (`{"prompt": ...}`) are continued as
/v1/completions continues them, without it.

Accept length = completion_tokens / verify_steps (bonus token included, as SGLang and vLLM report it);
per-position acceptance[i] = verify steps whose i-th draft token was accepted / verify steps.
Prompts with a "category" (the held-out chat set's MT-bench categories) get an accept length
per category too, as EAGLE and SpecForge report MT-bench.
"""
from __future__ import annotations

import asyncio
import json
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from drafter.prompts import raw_prompt_ids, read_prompts

if TYPE_CHECKING:
    from engine.api import GenerationOutput
    from engine.config import SpecConfig


@dataclass
class EvalResult:
    draft: str
    steps: int
    setting: str                 # SpecConfig.label: the step count, or a tree's STEPSxTOPKxTOKENS
    prompts: int
    completion_tokens: int
    verify_steps: int
    accept_length: float
    accept_rate: float
    per_position: list[float]
    by_category: dict[str, float] = field(default_factory=dict)   # accept length per prompt category


def prompt_ids(tok, prompt: list[dict] | str) -> list[int]:
    """What eval sends: a raw prompt as it is, a chat through the chat template with the assistant header."""
    if isinstance(prompt, str):
        return raw_prompt_ids(tok, prompt)
    text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


@dataclass
class Reply:
    """One greedy reply: the whole of its token ids and the request's last output (usage, spec)."""
    token_ids: list[int]
    last: GenerationOutput


async def greedy_replies(engine, prompts: list[list[dict] | str], max_tokens: int, bar=None) -> list[Reply]:
    """Every prompt at once through a started engine, greedy, each to max_tokens or what fits."""
    from engine.api import SamplingParams

    async def one(prompt) -> Reply:
        ids = prompt_ids(engine.tokenizer, prompt)
        room = engine.info.max_context - len(ids) - 1
        reply, last = [], None
        async for out in engine.generate(uuid.uuid4().hex, ids, SamplingParams(max_tokens=min(max_tokens, room),
                                                                               temperature=0.0)):
            if out.error:
                raise RuntimeError(out.error)
            reply += out.token_ids
            last = out
        if bar is not None:
            bar.update(1)
        return Reply(reply, last)

    return await asyncio.gather(*(one(m) for m in prompts))


async def _eval_one(args, loaded, prompts: list[list[dict] | str], categories: list[str | None],
                    max_tokens: int) -> EvalResult:
    """One setting (a chain or a tree): an engine over the already loaded models, every prompt at once."""
    from engine.loading import build_engine

    engine = build_engine(args, loaded)
    draft, steps = args.draft, args.spec.steps
    await engine.start()
    bar = tqdm(total=len(prompts), desc=f"eval {Path(draft).name} {args.spec.label}", unit="prompt")
    try:
        outs = [r.last for r in await greedy_replies(engine, prompts, max_tokens, bar)]
    finally:
        bar.close()
        await engine.shutdown()
    completion = sum(o.completion_tokens for o in outs)
    verify = sum(o.spec.verify_steps for o in outs)
    proposed = sum(o.spec.proposed_draft_tokens for o in outs)
    accepted = sum(o.spec.accepted_draft_tokens for o in outs)
    per_pos = [0] * steps
    by_category = defaultdict(lambda: [0, 0])   # category -> [completion tokens, verify steps]
    for o, c in zip(outs, categories):
        for i, n in enumerate(o.spec.accepted_per_position[:steps]):
            per_pos[i] += n
        if c is not None:
            by_category[c][0] += o.completion_tokens
            by_category[c][1] += o.spec.verify_steps
    return EvalResult(draft=str(draft), steps=steps, setting=args.spec.label, prompts=len(prompts),
                      completion_tokens=completion,
                      verify_steps=verify, accept_length=round(completion / verify, 4) if verify else 0.0,
                      accept_rate=round(accepted / proposed, 4) if proposed else 0.0,
                      per_position=[round(n / verify, 4) if verify else 0.0 for n in per_pos],
                      by_category={c: round(t / v, 4) if v else 0.0 for c, (t, v) in sorted(by_category.items())})


def evaluate(target: str, drafts: list[str], prompts_file: str, specs: list[SpecConfig], *, max_tokens: int = 256,
             limit: int = 0, device: str = "auto", dtype: str = "auto", max_batch: int = 16,
             max_context: int = 2048) -> list[EvalResult]:
    """One result per drafter and SpecConfig of `specs` (chains and trees)."""
    from engine.loading import LoadedModels, NativeEngineArgs

    convs = list(read_prompts(prompts_file, limit))
    prompts = [c.raw_prompt if c.raw_prompt is not None else c.first_prompt() for c in convs]
    categories = [c.category for c in convs]
    results = []
    for d in drafts:  # each drafter loads once; each setting gets a fresh engine over it
        args = [NativeEngineArgs(model=target, draft=d, spec=spec, device=device, dtype=dtype,
                                 max_batch=min(max_batch, len(prompts)),  # the KV cache: max_batch rows
                                 max_context=max_context, max_waiting=1 << 30) for spec in specs]
        loaded = LoadedModels.load(args[0])
        results += [asyncio.run(_eval_one(a, loaded, prompts, categories, max_tokens)) for a in args]
    return results


def short_names(paths: list[str]) -> dict[str, str]:
    """Each path's last components, as few as keep different paths apart (two `.../drafter` folders)."""
    parts = {p: Path(p).parts or (p,) for p in paths}
    for k in range(1, max(len(v) for v in parts.values()) + 1):
        names = {p: "/".join(v[-k:]) for p, v in parts.items()}
        if len(set(names.values())) == len(names):
            return names
    return {p: p for p in paths}


def table(results: list[EvalResult]) -> str:
    width = max(r.steps for r in results)
    names = short_names([r.draft for r in results])
    name_w = max(12, *(len(n) for n in names.values()))
    positions = "  ".join(f"{'pos' + str(i + 1):>6}" for i in range(width))
    head = f"{'draft':<{name_w}}  {'steps':>8}  accept_len  accept_rate  {positions}"
    lines = [head, "-" * len(head)]
    for r in results:
        pos = "  ".join(f"{p:6.3f}" for p in r.per_position)
        name = names[r.draft]
        lines.append(f"{name:<{name_w}}  {r.setting:>8}  {r.accept_length:10.3f}  {r.accept_rate:11.3f}  {pos}")
    categories = sorted({c for r in results for c in r.by_category})
    if categories:   # accept length per category: one row per category, one column per result
        drafts = len(names) > 1
        cols = [f"{names[r.draft]} {r.setting}" if drafts else r.setting for r in results]
        col_w = [max(8, len(c)) for c in cols]
        lines += ["", f"{'category':<12}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cols, col_w))]
        lines += [f"{c:<12}  " + "  ".join(f"{r.by_category.get(c, 0.0):{w}.3f}" for r, w in zip(results, col_w))
                  for c in categories]
    return "\n".join(lines)


def write_json(results: list[EvalResult], path: str | Path) -> None:
    Path(path).write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
