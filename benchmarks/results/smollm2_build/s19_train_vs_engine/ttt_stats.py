"""Training-time statistics (`drafter train`'s log fields: acc, sim_accept_length,
walked_accept_length) of one drafter over given conversations, CPU fp32, target in the loop.

  python benchmarks/results/smollm2_build/s19_train_vs_engine/ttt_stats.py TARGET DRAFT RECORDS.jsonl [MAX_ANSWER]
RECORDS: drafter-data records ({messages, completion_ids} or {prompt, completion_ids}); MAX_ANSWER
cuts each answer to that many tokens first.
"""
import json
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from drafter.shards import tokenize_batch  # noqa: E402
from drafter.train import summarize  # noqa: E402
from drafter.ttt import TTTModel, TTTStats, target_draft_probs  # noqa: E402
from models.eagle3_checkpoint import load_drafter  # noqa: E402
from models.llama import load_target  # noqa: E402

target_dir, draft_dir, records = sys.argv[1:4]
recs = [json.loads(line) for line in open(records)]
if len(sys.argv) > 4:
    for r in recs:
        r["completion_ids"] = [ids[:int(sys.argv[4])] for ids in r["completion_ids"]]
tok = AutoTokenizer.from_pretrained(target_dir)
target = load_target(target_dir, aux_layer_ids=sorted(load_drafter(draft_dir, None).config.aux_layer_ids))
drafter = load_drafter(draft_dir, target.embed_tokens.weight)
used = torch.arange(drafter.d2t.numel()) + drafter.d2t
model = TTTModel(drafter, 7).eval()
total = torch.zeros(TTTStats.size(7))
with torch.inference_mode():
    for ids, mask in tokenize_batch(tok, recs):
        ids, mask = torch.tensor([ids]), torch.tensor([mask])
        out = target(ids, capture_aux=True)
        probs, in_vocab = target_draft_probs(out.logits, used, drafter.t2d)
        total += model(ids, mask, out.aux_hidden, probs, in_vocab)[1].as_tensor()
print(json.dumps(summarize(TTTStats.from_tensor(total, 7), len(recs))))
