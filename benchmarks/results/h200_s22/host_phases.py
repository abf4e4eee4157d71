"""The engine thread's time per step by phase (NativeEngine.host_s) with 32 requests in flight,
on CPU with the tiny random pair (its forwards are short, so the host's own work shows): plain
decoding, the speculative engine at 0 steps, and chain 4. Requests go through NativeEngine.generate
in this process, as benchmarks/engine_load.py (and so batch_sweep) serve them.

    PYTHONPATH=. python benchmarks/results/h200_s22/host_phases.py plain|zero|chain
"""
import sys

import torch

from benchmarks.engine_load import run_load
from benchmarks.shapes import random_pair
from engine.config import SpecConfig
from engine.loading import LoadedModels, NativeEngineArgs, build_engine

torch.set_num_threads(1)
kind = sys.argv[1]
target, drafter, dev = random_pair("tiny", "cpu", "float32")
spec = None if kind == "plain" else SpecConfig(4, steps_by_batch=((32, 0 if kind == "zero" else 4),))
engine = build_engine(NativeEngineArgs(model="random-tiny", draft="random" if spec else None, spec=spec, device="cpu",
                                       dtype="float32", max_batch=32, max_context=512),
                      LoadedModels(target, drafter, dev, tokenizer=None))
engine.start_blocking()
prompts = torch.randint(0, 512, (128, 32), generator=torch.Generator().manual_seed(0)).tolist()
run_load(engine, prompts[:32], 32, 16, ignore_eos=True)  # warm-up
r = run_load(engine, prompts, 32, 128, ignore_eos=True)
print(f"{kind}: {r.throughput:.0f} tok/s, host ms/step", {k: round(v, 3) for k, v in r.host_ms_per_step.items()})
engine.stop_blocking()
