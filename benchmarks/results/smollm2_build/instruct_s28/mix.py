"""The fine-tuning mix of session 28: every instruction the target has answered, and as many
ShareGPT conversations beside them (replay, against forgetting), shuffled with seed 0.

Inputs are session 27's returned answers (not committed: ShareGPT is scraped content without a
license): runs/s27/instruction_answers.jsonl.gz (649 instructions: arena_hard, alpaca_eval) and
runs/s27/generated.jsonl.gz (14,632 conversations, 13,983 of them ShareGPT).

    python3 benchmarks/results/smollm2_build/instruct_s28/mix.py --out runs/s28/mix.jsonl \
        --trained-prompts runs/s28/trained_instructions80.jsonl

--trained-prompts also writes 80 of the instructions, evenly spread, up to their first user turn:
prompts for `drafter eval` that the fine-tuned drafter has trained on.
"""
import argparse
import gzip
import json
import random


def read(path: str) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instructions", default="runs/s27/instruction_answers.jsonl.gz")
    ap.add_argument("--replay", default="runs/s27/generated.jsonl.gz")
    ap.add_argument("--replay-ratio", type=float, default=1.0, help="ShareGPT conversations per instruction")
    ap.add_argument("--out", required=True)
    ap.add_argument("--trained-prompts", help="also write 80 of the instructions, up to their first user turn")
    a = ap.parse_args()
    rng = random.Random(0)
    instructions = read(a.instructions)
    replay = [r for r in read(a.replay) if r["id"].startswith("sharegpt")]
    rng.shuffle(replay)
    mix = instructions + replay[:round(a.replay_ratio * len(instructions))]
    rng.shuffle(mix)
    with open(a.out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in mix)
    print(f"{len(instructions)} instructions, {len(mix) - len(instructions)} ShareGPT: {a.out}")
    if a.trained_prompts:
        with open(a.trained_prompts, "w", encoding="utf-8") as f:
            for r in (instructions[i * len(instructions) // 80] for i in range(80)):
                turns = [i for i, m in enumerate(r["messages"]) if m["role"] == "user"]
                messages = r["messages"][:turns[0] + 1]
                f.write(json.dumps({"id": r["id"], "messages": messages}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
