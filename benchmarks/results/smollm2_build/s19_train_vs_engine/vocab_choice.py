"""How much of the held-out chat replies a draft vocabulary of N tokens covers, chosen on which
answers: the shipped drafter's vocabulary (session 14's answers) against the most frequent
tokens of session 18's answers (all, ShareGPT prompts only, target-written prompts only).

  python benchmarks/results/smollm2_build/s19_train_vs_engine/vocab_choice.py runs/s18/generated.jsonl.gz \
      /tmp/chat_replies.jsonl shipped/smollm2/drafter    # replies: engine_replies.py on heldout/chat.jsonl
"""
import collections
import gzip
import json
import sys

import torch
from safetensors.torch import load_file

generated, replies, drafter = sys.argv[1:4]
by_source = {"all": collections.Counter(), "sharegpt": collections.Counter(), "self": collections.Counter()}
for line in gzip.open(generated, "rt"):
    r = json.loads(line)
    ids = r["completion_ids"][0]
    by_source["all"].update(ids)
    source = r["id"].split("-")[0]
    if source in by_source:
        by_source[source].update(ids)
held = collections.Counter()
for line in open(replies):
    held.update(json.loads(line)["completion_ids"][0])
total = sum(held.values())


def coverage(vocab: set) -> float:
    return round(sum(c for t, c in held.items() if t in vocab) / total, 4)


d2t = load_file(f"{drafter}/model.safetensors")["d2t"]
out = {"held_out_reply_tokens": total, "shipped": coverage(set((torch.arange(len(d2t)) + d2t).tolist()))}
for name, counts in by_source.items():
    for n in (8192, 12288, 16384):
        out[f"{name}_{n}"] = coverage({t for t, _ in counts.most_common(n)})
print(json.dumps(out, indent=1))
