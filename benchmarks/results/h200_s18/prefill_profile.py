"""Why plain decoding on H200 spends ~40-80 ms per request before its first token (session 18's
pair.log: ttft 42-75 ms against ~0.9 ms a decode step): time the engine's prefill of each held-out
prompt (synchronized, 3 repeats, median) in the plain compiled engine the sweep runs, count the
operators one prefill dispatches (views apart, each launches a kernel on GPU), then profile four
prefills under torch.profiler (top ops by CPU and by device time).

  python3 benchmarks/results/h200_s18/prefill_profile.py --model runs/smollm2/target --out DIR
  # and with --compile --prefill-graphs: the captured prefill (session 18 wrote it; not yet run on a GPU)
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.engine_load import HELDOUT, load_prompts  # noqa: E402
from engine.loading import LoadedModels, NativeEngineArgs, build_engine  # noqa: E402
from engine.sampling import BatchSampling  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--device", default="cuda")
ap.add_argument("--dtype", default="bfloat16")
ap.add_argument("--compile", action="store_true")
ap.add_argument("--prefill-graphs", action="store_true", help="the captured prefill (engine/decoder.py)")
ap.add_argument("--out", required=True)
args = ap.parse_args()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
eargs = NativeEngineArgs(model=args.model, device=args.device, dtype=args.dtype, max_batch=1,
                         compile=args.compile, compile_max_batch=1, prefill_graphs=args.prefill_graphs)
loaded = LoadedModels.load(eargs)
prompts = load_prompts(HELDOUT, loaded.tokenizer, 12)
t0 = time.perf_counter()
engine = build_engine(eargs, loaded)
engine.start_blocking()
engine.stop_blocking()
print(f"engine ready in {time.perf_counter() - t0:.1f} s", flush=True)
dec = engine.decoder
sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
greedy = BatchSampling.all_greedy_rows(1, dec.device)
lines = []
for rep in range(3):
    for i, p in enumerate(prompts):
        sync()
        t = time.perf_counter()
        dec.prefill(0, p, greedy)
        sync()
        lines.append((rep, i, len(p), (time.perf_counter() - t) * 1000))
for rep in range(3):
    ms = [m for r, _, _, m in lines if r == rep]
    print(f"repeat {rep}: prefill ms median {statistics.median(ms):.1f} min {min(ms):.1f} max {max(ms):.1f}  "
          + " ".join(f"{n}:{m:.0f}" for r, _, n, m in lines if r == rep), flush=True)


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.views += func.is_view
        self.ops += not func.is_view
        return func(*args, **(kwargs or {}))


with CountOps() as count:
    dec.prefill(0, prompts[0], greedy)
print(f"one prefill ({len(prompts[0])} tokens): {count.ops} operators that compute, {count.views} views", flush=True)
lines.append(("ops", count.ops, "views", count.views))
acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if args.device == "cuda" else [])
with torch.profiler.profile(activities=acts) as prof:
    for p in prompts[:4]:
        dec.prefill(0, p, greedy)
    sync()
by_cpu = prof.key_averages().table(sort_by="cpu_time_total", row_limit=30)
by_dev = prof.key_averages().table(sort_by="cuda_time_total" if args.device == "cuda" else "self_cpu_time_total",
                                   row_limit=30)
(out / "prefill_profile.txt").write_text(f"{lines}\n\nby CPU time\n{by_cpu}\n\nby device time\n{by_dev}\n")
print(by_cpu[:6000], flush=True)
print(by_dev[:6000], flush=True)
