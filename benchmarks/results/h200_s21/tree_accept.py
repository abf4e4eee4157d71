"""Accept length of greedy chains and trees on the real SmolLM2 pair, CPU, float32: how far a
tree's extra candidates carry the shipped drafter (issue 19's lever on the pair's speedup).
Every prompt of the file (up to LIMIT) at once through the native engine; accept length =
completion tokens / verify steps.

    python benchmarks/results/h200_s21/tree_accept.py shipped/smollm2/heldout/chat.jsonl 24 128 \
        4,1,5 4,4,8 5,4,16 6,8,32 6,8,64      # settings: steps,topk,draft_tokens
"""
import asyncio
import json
import sys
import time

from drafter.evaluate import greedy_replies
from drafter.prompts import read_prompts
from engine.decoder import SpecConfig
from engine.loading import LoadedModels, NativeEngineArgs, build_engine


async def replies(args, loaded, prompts, max_tokens):
    engine = build_engine(args, loaded)
    await engine.start()
    try:
        return await greedy_replies(engine, prompts, max_tokens)
    finally:
        await engine.shutdown()


def main() -> None:
    prompts_file, limit, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    prompts = [c.raw_prompt if c.raw_prompt is not None else c.first_prompt()
               for c in read_prompts(prompts_file, limit)]
    loaded = None
    for setting in sys.argv[4:]:
        steps, topk, n = (int(x) for x in setting.split(","))
        args = NativeEngineArgs(model="runs/smollm2-hf", draft="shipped/smollm2/drafter",
                                spec=SpecConfig(steps, topk, n), device="cpu", dtype="float32",
                                max_batch=len(prompts), max_context=1024, max_waiting=1 << 30)
        loaded = loaded or LoadedModels.load(args)
        t0 = time.time()
        outs = [r.last for r in asyncio.run(replies(args, loaded, prompts, max_tokens))]
        tokens, verifies = sum(o.completion_tokens for o in outs), sum(o.spec.verify_steps for o in outs)
        print(json.dumps({"prompts": prompts_file, "steps": steps, "topk": topk, "draft_tokens": n,
                          "accept_length": round(tokens / verifies, 3), "tokens": tokens,
                          "wall_s": round(time.time() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
