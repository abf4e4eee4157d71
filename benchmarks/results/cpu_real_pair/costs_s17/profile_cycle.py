"""Where a CPU engine step's time goes, by op and input shape (torch.profiler): SmolLM2's GGUF in
float32, or with its 4-bit projections kept (bfloat16, as cpu-fast serves), plain or a chain of
STEPS drafts, batch 1, 160 tokens of context, 10 steps after 5 unmeasured ones.

  PYTHONPATH=. .venv/bin/python benchmarks/results/cpu_real_pair/costs_s17/profile_cycle.py GGUF fp32|q4 STEPS
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from engine.config import SpecConfig
from engine.decoder import BatchDecoder
from engine.loading import NativeEngineArgs, load_models
from engine.sampling import BatchSampling

gguf, form, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
q4 = form == "q4"
target, drafter, _ = load_models(NativeEngineArgs(model=gguf, draft="shipped/smollm2/drafter", spec=SpecConfig(1),
                                                  device="cpu", dtype="bfloat16" if q4 else "float32", gguf_q4=q4))
dec = BatchDecoder(target, drafter if steps else None, SpecConfig(steps) if steps else None, 1, 1024)
greedy = BatchSampling.all_greedy_rows(1, dec.device)
prompt = torch.randint(0, target.config.vocab_size, (160,), generator=torch.Generator().manual_seed(0)).tolist()
with torch.inference_mode():
    dec.prefill(0, prompt, greedy)
    ctx = dec.lens[0]

    def step():
        dec.lens[0] = ctx  # rewind: every step runs at the same context
        dec.step(1, greedy)

    for _ in range(5):
        step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(10):
            step()
print(f"{form}, {steps} draft steps: per step {prof.key_averages().self_cpu_time_total / 10 / 1000:.2f} ms "
      f"(profiled; 10 steps)")
print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=16,
                                                         max_name_column_width=36, max_shapes_column_width=60))
