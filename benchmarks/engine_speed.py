"""Decode speed of the native engine with and without speculation, side by side in one run.

Batch 1, greedy, the same prompts for every setting, each reply ending at the target's EOS
(or after max_tokens; --ignore-eos: always max_tokens); warm-up first, device synchronised,
median over prompts and repeats. Prints a table and optionally writes JSON.

  python -m benchmarks.engine_speed --model shipped/target --draft shipped/drafter --steps 0,1,2,3,4

Without --model, a random pair of a real shape (--shape) decodes random prompts to max_tokens;
--synthetic-accept then sets its acceptance (BatchDecoder.use_synthetic_acceptance): the cycle
costs are real, the accept length chosen, and the output says SYNTHETIC.

  python -m benchmarks.engine_speed --shape 8b --steps 0,3 --synthetic-accept 0.85,0.8,0.75 --compile
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.shapes import random_pair
from engine.decoder import BatchDecoder, SpecConfig
from engine.loading import NativeEngineArgs, load_models, load_tokenizer
from engine.sampling import BatchSampling
from engine.scheduler import eos_ids


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _upto_stop(tokens: list[int], stop_ids: frozenset[int]) -> tuple[int, bool]:
    """How many of a step's tokens count (through the first stop token), and whether it stopped."""
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return i + 1, True
    return len(tokens), False


def decode_once(decoder: BatchDecoder, prompt: list[int], max_tokens: int, overlap: bool = True,
                stop_ids: frozenset[int] = frozenset()) -> tuple[int, int, float]:
    """Returns (tokens, verify steps, decode seconds excluding prefill).

    Decoding ends after max_tokens or at a token of stop_ids (the target's EOS, as a server
    ends a reply; empty: always max_tokens). Greedy decoding is lossless, so every setting
    stops at the same token.
    overlap: as the server's engine loop runs on GPU, step n+1 is launched before step n is
    read (the last launched step may be one more than needed: its time counts, its tokens do not).
    """
    s = BatchSampling.all_greedy_rows(1, decoder.device)
    first = decoder.prefill(0, prompt, s)
    sync(decoder.device)
    if first in stop_ids:
        return 1, 0, 0.0
    t0, tokens, steps = time.perf_counter(), 1, 0
    if overlap and decoder.overlap and decoder.device_side(s):
        current = decoder.launch(1)
        while current is not None:
            ahead = decoder.launch(1) if decoder.room_to_launch(1) else None
            got, stopped = _upto_stop(decoder.collect(current)[0].tokens, stop_ids)
            tokens, steps = tokens + got, steps + 1
            if (stopped or tokens >= max_tokens) and ahead is not None:
                decoder.collect(ahead)
                break
            current = ahead
    else:
        stopped = False
        while not stopped and tokens < max_tokens:
            got, stopped = _upto_stop(decoder.step(1, s)[0].tokens, stop_ids)
            tokens, steps = tokens + got, steps + 1
    sync(decoder.device)
    return tokens, steps, time.perf_counter() - t0


def stop_ids_for(args, target, tokenizer) -> frozenset[int]:
    """The stop ids of a measurement run with add_measure_args' flags."""
    return frozenset() if args.ignore_eos else frozenset(eos_ids(target, tokenizer))


def measure(target, drafter, spec, prompts, max_tokens, repeats, max_context, compile: bool = False,
            overlap: bool = True, stop_ids: frozenset[int] = frozenset(), synthetic: list[float] | None = None) -> dict:
    decoder = BatchDecoder(target, drafter if spec else None, spec, 1, max_context, compile=compile)
    if spec and synthetic:
        decoder.use_synthetic_acceptance(synthetic)
    # Warm-up on the longest prompt, to max_tokens: captures the graphs of every span the runs reach.
    decode_once(decoder, max(prompts, key=len), max_tokens, overlap)
    rates, accept, per_step, decoded = [], [], [], []
    for _ in range(repeats):
        for p in prompts:
            n, steps, secs = decode_once(decoder, p, max_tokens, overlap, stop_ids)
            if steps == 0:  # the first token ended the reply: nothing decoded
                continue
            rates.append((n - 1) / secs)
            accept.append(n / steps)
            per_step.append((n - 1) / steps)
            decoded.append(n - 1)
    if not rates:
        raise RuntimeError("every reply ended at its first token: nothing to time (try --ignore-eos)")
    # accept_length: the reporting convention (completion tokens / verify steps, first token
    # included); tokens_per_step: decode tokens per step only, and decode_tokens_per_reply
    # (each reply also pays the one step launched ahead of its end): what the cost model needs.
    return {"tok_per_s": statistics.median(rates), "accept_length": statistics.mean(accept),
            "tokens_per_step": statistics.mean(per_step), "decode_tokens_per_reply": statistics.mean(decoded)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="target checkpoint (default: a random pair of --shape)")
    ap.add_argument("--draft")
    ap.add_argument("--shape", default="8b", choices=["8b", "tiny"], help="the random pair's shape, without --model")
    ap.add_argument("--prompt-len", type=int, default=128, help="random prompts' length, without --model")
    ap.add_argument("--synthetic-accept", help="per-position acceptance rates, comma list (random pair only)")
    ap.add_argument("--steps", default="0,1,2,3,4", help="comma list; 0 = no speculation")
    ap.add_argument("--topk", type=int, default=1)
    ap.add_argument("--draft-tokens", type=int, default=0)
    add_measure_args(ap)
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args(argv)

    steps = [int(s) for s in args.steps.split(",")]
    spec_any = SpecConfig(max(steps), args.topk, args.draft_tokens if args.topk > 1 else 0) if max(steps) else None
    synthetic = [float(r) for r in args.synthetic_accept.split(",")] if args.synthetic_accept else None
    if args.model:
        if synthetic:
            ap.error("--synthetic-accept is for the random pair (no --model): a real pair's acceptance is measured")
        target, drafter, device = load_models(NativeEngineArgs(model=args.model, draft=args.draft, spec=spec_any,
                                                               device=args.device, dtype=args.dtype))
        tok = load_tokenizer(args.model)
        prompts, stop_ids = load_prompts(args.prompts, tok, args.num_prompts), stop_ids_for(args, target, tok)
    else:
        target, drafter, device = random_pair(args.shape, args.device, args.dtype)
        gen = torch.Generator().manual_seed(0)
        shape = (args.num_prompts, args.prompt_len)
        prompts = torch.randint(0, target.config.vocab_size, shape, generator=gen).tolist()
        stop_ids = frozenset()  # random weights: every reply runs to max_tokens
    rows = []

    def save() -> None:  # after every setting too: a run cut short keeps what it measured
        if args.json:
            Path(args.json).write_text(json.dumps({"device": str(device), "args": vars(args),
                                                   "synthetic_acceptance": synthetic, "rows": rows}, indent=2))

    for s in steps:
        spec = SpecConfig(s, args.topk, args.draft_tokens if args.topk > 1 else 0) if s else None
        r = measure(target, drafter, spec, prompts, args.max_tokens, args.repeats, args.max_context, args.compile,
                    args.overlap, stop_ids, synthetic)
        rows.append({"steps": s, "topk": args.topk if s else 0, **r})
        print(f"steps {s}: {r['tok_per_s']:.1f} tok/s, accept length {r['accept_length']:.2f}", flush=True)
        save()
    base = rows[0]["tok_per_s"] if steps[0] == 0 else None
    print(f"device={device} dtype={target.embed_tokens.weight.dtype} model={args.model or 'random ' + args.shape} "
          f"draft={args.draft}" + (f" SYNTHETIC acceptance {synthetic}" if synthetic else ""))
    print(f"{'steps':>5} {'tok/s':>9} {'accept':>7} {'speedup':>8}")
    for r in rows:
        r["speedup"] = r["tok_per_s"] / base if base else None
        sp = f"{r['speedup']:.2f}x" if base else "-"
        print(f"{r['steps']:>5} {r['tok_per_s']:>9.1f} {r['accept_length']:>7.2f} {sp:>8}")
    save()



def add_measure_args(ap: argparse.ArgumentParser) -> None:
    """The flags of an in-process measurement, shared by the scripts built on this one."""
    ap.add_argument("--prompts", help="JSONL of {messages: [...]} (chat) or {prompt: str} (default: held-out set)")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-context", type=int, default=1024)
    ap.add_argument("--compile", action="store_true", help="torch.compile the decode steps")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="decode max_tokens whatever the target emits (default: end each reply at its EOS, as served)")
    ap.add_argument("--no-overlap", dest="overlap", action="store_false",
                    help="read each step before launching the next (default: overlapped, as the server runs)")


def load_prompts(path: str | None, tok, n: int) -> list[list[int]]:
    if path is None:
        texts = [[{"role": "user", "content": f"Write a Python function number {i} that parses a config file."}]
                 for i in range(n)]
    else:
        texts = []
        for line in Path(path).read_text().splitlines()[:n]:
            rec = json.loads(line)
            texts.append(rec.get("messages") or rec["prompt"])
    return [encode_prompt(tok, t) for t in texts]


def encode_prompt(tok, text: list[dict] | str) -> list[int]:
    """Token ids of a chat (messages, with the generation prompt) or of a raw prompt."""
    if isinstance(text, list):
        return tok.apply_chat_template(text, add_generation_prompt=True, tokenize=True, return_dict=False)
    return tok.encode(text)


if __name__ == "__main__":
    main()
