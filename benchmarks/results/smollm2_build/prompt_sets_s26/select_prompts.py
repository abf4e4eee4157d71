"""The ShareGPT prompt samples of this folder's evals, by position in the prompt file that
shipped/smollm2/data/sharegpt_prompts.py rebuilds (45,484 prompts, in the order the builds answered
them): session 14 answered about the first 27,855, session 18 those from 32,500 on, so positions
29,500-32,499 were never answered. Consecutive prompts often come from one conversation, so each
sample takes every k-th prompt.

    python shipped/smollm2/data/sharegpt_prompts.py --out runs/sharegpt_prompts.jsonl.gz
    python benchmarks/results/smollm2_build/prompt_sets_s26/select_prompts.py \
        runs/sharegpt_prompts.jsonl.gz runs/prompt_sets
"""
import gzip
import sys
from pathlib import Path

SAMPLES = {"train_sharegpt60": range(0, 60), "train_sharegpt60_spread": range(0, 21654, 367),
           "unseen_sharegpt60_spread": range(29500, 32451, 50)}

lines = gzip.open(sys.argv[1], "rt", encoding="utf-8").read().split("\n")  # not splitlines: texts hold U+2028
out = Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
for name, picks in SAMPLES.items():
    (out / f"{name}.jsonl").write_text("".join(lines[i] + "\n" for i in picks), encoding="utf-8")
