"""vLLM against the native engine on the real pair, with the drafter that ships: our server on
vLLM's CPU build (the cpu-vllm profile with --model / --draft) answers held-out chat and raw
completion prompts through the official openai client, greedy, EAGLE-3 with 3 speculative
tokens, float32; the native engine decodes the same token ids (benchmarks.engine_load.native_replies).
Writes OUT/smollm2_http.{json,md}: equal texts, and both engines' accept lengths.

  .venv/bin/python benchmarks/results/vllm_parity/smollm2_http.py --target runs/smollm2-hf \
      --draft shipped/smollm2/drafter --num-prompts 20 4 --max-tokens 96 --out benchmarks/results/vllm_parity
"""
import argparse
import json
import sys
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from benchmarks.engine_load import native_replies  # noqa: E402
from benchmarks.server_proc import cpu_vllm_server  # noqa: E402
from drafter.prompts import raw_prompt_ids  # noqa: E402
from models.tokenizer import load_tokenizer  # noqa: E402
from server.prompts import chat_prompt_ids  # noqa: E402
from server.protocol import ChatCompletionRequest  # noqa: E402

HELDOUT = ROOT / "shipped" / "smollm2" / "heldout"
MODEL = "smollm2"
STEPS = 3

ap = argparse.ArgumentParser()
ap.add_argument("--target", required=True)
ap.add_argument("--draft", required=True)
ap.add_argument("--num-prompts", type=int, nargs=2, default=[20, 4], help="chat, raw completion")
ap.add_argument("--max-tokens", type=int, default=96)
ap.add_argument("--out", required=True)
args = ap.parse_args()

tok = load_tokenizer(args.target)
chats = [json.loads(line)["messages"] for line in (HELDOUT / "chat.jsonl").read_text().splitlines()]
texts = [json.loads(line)["prompt"] for line in (HELDOUT / "completion.jsonl").read_text().splitlines()]
chats, texts = chats[:args.num_prompts[0]], texts[:args.num_prompts[1]]
ids = [chat_prompt_ids(tok, ChatCompletionRequest(model=MODEL, messages=m)) for m in chats]
ids += [raw_prompt_ids(tok, t) for t in texts]
native = native_replies(args.target, args.draft, ids, steps=STEPS, max_tokens=args.max_tokens)

log = Path(args.out) / "smollm2_http_server.log"
rows = []
served = ["--model", args.target, "--draft", args.draft, "--served-model-name", MODEL]
with cpu_vllm_server(log, served, 600) as (url, _):
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    kw = dict(model=MODEL, temperature=0, max_tokens=args.max_tokens)
    for i, n in enumerate(native):
        if i < len(chats):
            r = client.chat.completions.create(messages=chats[i], **kw)
            text = r.choices[0].message.content
        else:
            r = client.completions.create(prompt=texts[i - len(chats)], **kw)
            text = r.choices[0].text
        spec = r.usage.model_extra["spec_decoding"]
        rows.append({"prompt": i, "kind": "chat" if i < len(chats) else "completion", "equal_text": text == n["text"],
                     "vllm_tokens": r.usage.completion_tokens, "native_tokens": len(n["token_ids"]),
                     "vllm_verify_steps": spec["verify_steps"], "native_verify_steps": n["verify_steps"]})
        print(rows[-1], flush=True)


def accept(side: str) -> float:
    return sum(r[f"{side}_tokens"] for r in rows) / sum(r[f"{side}_verify_steps"] for r in rows)


equal = sum(r["equal_text"] for r in rows)
summary = {"target": args.target, "draft": args.draft, "steps": STEPS, "max_tokens": args.max_tokens,
           "prompts": len(rows), "equal_texts": equal, "vllm_accept_length": round(accept("vllm"), 3),
           "native_accept_length": round(accept("native"), 3)}
out = Path(args.out)
(out / "smollm2_http.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
lines = [f"# vLLM (our server, cpu-vllm) vs the native engine: {args.target} + {args.draft}", "",
         f"Equal greedy texts: {equal}/{len(rows)}; accept length (completion tokens / verify steps, 3 steps): "
         f"vLLM {summary['vllm_accept_length']}, native {summary['native_accept_length']}.", "",
         "| prompt | kind | equal text | vLLM tokens | native tokens | vLLM verify steps | native verify steps |",
         "|---|---|---|---|---|---|---|"]
lines += [f"| {r['prompt']} | {r['kind']} | {r['equal_text']} | {r['vllm_tokens']} | {r['native_tokens']} | "
          f"{r['vllm_verify_steps']} | {r['native_verify_steps']} |" for r in rows]
(out / "smollm2_http.md").write_text("\n".join(lines) + "\n")
print(json.dumps(summary))
