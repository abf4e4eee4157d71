"""Accept length of greedy chains and trees on the real SmolLM2 pair, CPU, float32: how far a
tree's extra candidates carry the shipped drafter (issue 19's lever on the pair's speedup).
`drafter.evaluate` with one SpecConfig per setting, every prompt (up to LIMIT) at once; accept
length = completion tokens / verify steps.

    python benchmarks/results/h200_s21/tree_accept.py shipped/smollm2/heldout/chat.jsonl 24 128 \
        4,1,5 4,4,8 5,4,16 6,8,32 6,8,64      # settings: steps,topk,draft_tokens
"""
import json
import sys

from drafter.evaluate import evaluate
from engine.decoder import SpecConfig


def main() -> None:
    prompts_file, limit, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    specs = [SpecConfig(*(int(x) for x in setting.split(","))) for setting in sys.argv[4:]]
    results = evaluate("runs/smollm2-hf", ["shipped/smollm2/drafter"], prompts_file, specs, max_tokens=max_tokens,
                       limit=limit, device="cpu", dtype="float32", max_batch=limit, max_context=1024)
    for spec, r in zip(specs, results):
        print(json.dumps({"prompts": prompts_file, "steps": spec.steps, "topk": spec.topk,
                          "draft_tokens": spec.draft_tokens, "accept_length": r.accept_length,
                          "tokens": r.completion_tokens}), flush=True)


if __name__ == "__main__":
    main()
