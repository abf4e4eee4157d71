"""vLLM 0.32's CPU build decoding SmolLM2 alone, one request, as ab_s36_vllm's compiled plain side serves it
(float32, max_model_len 1024, 8 sequences, compiled, Intel's OpenMP preloaded), timed and then profiled in
this process (VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps vLLM's engine and worker here): the other half of
profile_steps.py's comparison.

  LD_PRELOAD=$PWD/.venv-vllm/lib/libiomp5.so VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 \\
      .venv-vllm/bin/python benchmarks/results/cpu_real_pair/compiled_plain_profile_s37/vllm_profile.py \\
      --model runs/smollm2-hf > benchmarks/results/cpu_real_pair/compiled_plain_profile_s37/vllm_profile.txt
"""
from __future__ import annotations

import argparse
import json
import time

import torch
from vllm import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    llm = LLM(model=a.model, dtype="float32", max_model_len=1024, max_num_seqs=8, enforce_eager=False)
    question = json.loads(open("shipped/smollm2/heldout/chat.jsonl").readline())["messages"]
    prompt = llm.get_tokenizer().apply_chat_template(question, tokenize=False, add_generation_prompt=True)
    # ignore_eos: every run decodes the same number of tokens; one token alone is the prefill's time
    full, first = (SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (a.tokens, 1))
    llm.generate([prompt], full)   # warm-up
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        llm.generate([prompt], first)
        t1 = time.perf_counter()
        llm.generate([prompt], full)
        t2 = time.perf_counter()
        times.append(((t2 - t1) - (t1 - t0)) * 1000.0 / (a.tokens - 1))
    print("decode step ms (3 timings):", [round(t, 2) for t in times])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        llm.generate([prompt], full)
    print(f"profiled: one request of {a.tokens} tokens")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
