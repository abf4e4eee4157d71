"""transformers `generate` at batch 1, greedy, on the prompts our serving benchmark sends: the
peer a CPU user would otherwise run, on the same weights and dtype.

Each reply is timed token by token through a streamer, and its decode rate is (tokens - 1) /
(last token - first token), the per-request rate benchmarks/serving.py reports over HTTP, so the
two are read side by side. One warm-up reply first (a static cache is allocated, and compiled
where transformers compiles it). Writes --out as JSON: {"summary": {"decode_tok_s": stats}, ...}.

  python -m benchmarks.hf_generate --model runs/smollm2-hf \\
      --prompts benchmarks/results/batch_sweep/cpu_http/prompts.jsonl \\
      --dtype bfloat16 --cache static --max-tokens 128 --out runs/hf_bf16_static.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.engine_load import load_prompts
from benchmarks.report import provenance
from benchmarks.serving import sample_stats


class TokenClock:
    """A generate streamer that keeps the time of every new token (its first call is the prompt)."""

    def __init__(self):
        self.times: list[float] = []
        self.prompt_seen = False

    def put(self, value) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def main(argv: list[str] | None = None) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF folder (drafter export-hf writes one from a GGUF)")
    ap.add_argument("--prompts", required=True, help="JSONL of {messages} or {prompt}")
    ap.add_argument("--num-prompts", type=int, default=9)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--cache", default="dynamic", choices=["dynamic", "static"], help="cache_implementation")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).eval()
    prompts = [torch.tensor([ids]) for ids in load_prompts(args.prompts, tok, args.num_prompts)]
    gen = dict(do_sample=False, max_new_tokens=args.max_tokens, pad_token_id=tok.eos_token_id)
    if args.cache == "static":
        gen["cache_implementation"] = "static"

    def reply(ids: torch.Tensor) -> TokenClock:
        clock = TokenClock()
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), streamer=clock, **gen)
        return clock

    reply(prompts[0])  # warm-up
    rates, tokens, t0 = [], 0, time.perf_counter()
    for ids in prompts:
        clock = reply(ids)
        tokens += len(clock.times)
        if len(clock.times) > 1:
            rates.append((len(clock.times) - 1) / (clock.times[-1] - clock.times[0]))
    wall = time.perf_counter() - t0
    result = {"side": f"transformers {args.dtype} {args.cache} cache", "threads": torch.get_num_threads(),
              "summary": {"completed": len(prompts), "output_throughput": tokens / wall,
                          "decode_tok_s": sample_stats(rates)},
              "provenance": provenance()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{result['side']}: decode {statistics.median(rates):.1f} tok/s per reply (median), "
          f"{tokens / wall:.1f} tok/s overall")
    return result


if __name__ == "__main__":
    main()
