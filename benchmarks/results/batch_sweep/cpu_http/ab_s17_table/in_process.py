"""The same comparison without HTTP: one native engine in this process (loaded in its own thread,
as the server's engine process runs it), over the 9 prompts of ../prompts.jsonl twice (18
requests) at concurrency C, 128 tokens, greedy, after one warm-up request set; two timed runs.
SIDE: plain, table (cpu-default's), or zero (0 draft steps at every batch size).

  PYTHONPATH=. .venv/bin/python benchmarks/results/batch_sweep/cpu_http/ab_s17_table/in_process.py SIDE C
"""
import json
import sys

from benchmarks.engine_load import load_prompts, run_load
from engine.config import SpecConfig
from engine.loading import NativeEngineArgs, build_engine
from launch.profiles import resolve

side, c = sys.argv[1], int(sys.argv[2])
profile = resolve("cpu-default", environ={}).profile   # its model, drafter and steps table
spec = {"plain": None, "table": SpecConfig(3, steps_by_batch=tuple(profile.speculative.steps_by_batch)),
        "zero": SpecConfig(2, steps_by_batch=((8, 0),))}[side]
args = NativeEngineArgs(model=profile.model.path, draft=profile.model.draft if spec else None, spec=spec,
                        device="cpu", dtype="float32", max_batch=8, max_context=4096)
engine = build_engine(args)
engine.start_blocking()
prompts = load_prompts("benchmarks/results/batch_sweep/cpu_http/prompts.jsonl", engine.tokenizer, 9)
batch = [prompts[i % 9] for i in range(18)]
run_load(engine, batch[:c], c, 128)
runs = [run_load(engine, batch, c, 128) for _ in range(2)]
print(json.dumps({"side": side, "c": c, "throughput": [round(r.throughput, 1) for r in runs],
                  "request_tok_s": [round(r.request_tok_s, 1) for r in runs],
                  "accept_length": round(runs[0].accept_length, 3)}), flush=True)
engine.stop_blocking()
