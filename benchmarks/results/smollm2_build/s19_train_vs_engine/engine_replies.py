"""The native engine's greedy replies (chain of 3, CPU fp32, 256 tokens) to chat prompts, as
drafter-data records with their exact ids, and the engine's own accept length over them.

  python benchmarks/results/smollm2_build/s19_train_vs_engine/engine_replies.py TARGET DRAFT PROMPTS.jsonl OUT.jsonl
"""
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from drafter.evaluate import greedy_replies  # noqa: E402
from engine.decoder import SpecConfig  # noqa: E402
from engine.loading import LoadedModels, NativeEngineArgs, build_engine  # noqa: E402

target, draft, prompts_file, out_file = sys.argv[1:5]
prompts = [json.loads(line)["messages"] for line in open(prompts_file)]
args = NativeEngineArgs(model=target, draft=draft, spec=SpecConfig(steps=3), device="cpu", dtype="float32",
                        max_batch=16, max_context=2048, max_waiting=1 << 30)


async def main():
    engine = build_engine(args, LoadedModels.load(args))
    await engine.start()
    try:
        replies = await greedy_replies(engine, prompts, 256)
    finally:
        await engine.shutdown()
    return [{"messages": m + [{"role": "assistant", "content": ""}], "completion_ids": [r.token_ids],
             "verify_steps": r.last.spec.verify_steps, "completion_tokens": r.last.completion_tokens}
            for m, r in zip(prompts, replies)]


rows = asyncio.run(main())
Path(out_file).write_text("".join(json.dumps(r) + "\n" for r in rows))
verify = sum(r["verify_steps"] for r in rows)
tokens = sum(r["completion_tokens"] for r in rows)
print(json.dumps({"prompts": len(rows), "completion_tokens": tokens, "verify_steps": verify,
                  "accept_length": round(tokens / verify, 3),
                  "accept_length_after_first": round((tokens - len(rows)) / verify, 3)}))
