"""Why plain decoding's one-request loop runs about 10% below the speculative engine at 0 steps
(benchmarks/results/h200_s34/: 996 against 1,099 tok/s compiled on an H100, while step_costs timed a
plain step at 0.896 ms, 1,116 tok/s). One process, the real pair, bf16, compiled, one row:

1. both engines built and served as `batch_sweep --concurrency 1` builds and serves them, alternating,
   twice (does the gap show here too?);
2. each engine's decoder, its serving thread stopped, timed as `step_costs` times a step (rounds of
   launches ahead, `loop_step_ms`), alternating, three times (is it the step, or the serving loop?);
3. a plain decoder built as `step_costs` builds it (one row, compiled lazily, no saved steps);
4. one profiled call of loop_step_ms on each (8 rounds of 8 steps): the kernels, their count and GPU time per step.

  python benchmarks/results/h200_s35/plain_loop.py --model runs/smollm2/target --draft shipped/smollm2/drafter \\
      --compile-cache runs/h200_s35/compiled_steps --out $OUT/plain_loop
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import torch

from benchmarks import batch_sweep
from benchmarks.step_costs import PIPELINE, WARM_ROUNDS, loop_step_ms
from engine.config import SpecConfig
from engine.decoder import BatchDecoder
from models.layers import own_cache_copy


def kernel_table(dec, prompt: list[int], path: Path) -> dict:
    """One profiled call of loop_step_ms (its untimed rounds and 5 timed ones, all profiled): every
    GPU kernel's time, written to `path`; returns the kernels launched and their GPU time per step."""
    rounds = 5
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        loop_step_ms(dec, prompt, rounds)
    steps = (rounds + WARM_ROUNDS) * PIPELINE
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    path.write_text(prof.key_averages().table(sort_by="self_device_time_total", row_limit=60))
    return {"kernels_per_step": sum(e.count for e in events) / steps,
            "gpu_ms_per_step": sum(e.self_device_time_total for e in events) / 1000.0 / steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--compile-cache", default="")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--device", default="cuda", help="cpu: a quick check of the script (float32, eager)")
    ap.add_argument("--out", required=True, help="a folder")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = a.device == "cuda"
    args = batch_sweep.parse_args([
        "--model", a.model, "--draft", a.draft, "--device", a.device, "--dtype", "bfloat16" if gpu else "float32",
        *(["--compile", "--prefill-graphs", "--no-compile-prefill", "--compile-cache", a.compile_cache] if gpu else []),
        "--max-tokens", "256" if gpu else "16",
        "--steps", "4", "--concurrency", "1", "--num-prompts", "16", "--rounds", "1",
        "--prompts", "shipped/smollm2/heldout/chat.jsonl", "--out", str(out / "served.json")])
    loaded, prompts = batch_sweep.load(args)
    engines = {
        "plain": batch_sweep.build(args, dataclasses.replace(loaded, target=own_cache_copy(loaded.target),
                                                             drafter=None), None),
        "0 steps": batch_sweep.build(args, loaded, SpecConfig(4, steps_by_batch=((1, 0),))),
    }
    engines["0 steps"].decoder.warm_up(1)
    result: dict = {"gpu": torch.cuda.get_device_name() if gpu else None, "torch": torch.__version__}

    progress = batch_sweep.Progress(out / "served.partial.json", resume=False)
    for turn in ("", " again"):
        for label, engine in engines.items():
            batch_sweep.measure(engine, prompts, 1, args, label + turn, 0, progress)
    result["served"] = [{k: r[k] for k in ("setting", "throughput", "decode_tok_s", "wait_ms_per_step")}
                        for r in progress.rows]

    decoders = {label: engine.decoder for label, engine in engines.items()}
    for engine in engines.values():
        engine.stop_blocking()
    prompt = prompts[0]
    loop = {label: [] for label in decoders}
    for _ in range(3):
        for label, dec in decoders.items():
            loop[label].append(loop_step_ms(dec, prompt, a.iters))
    decoders["plain, as step_costs builds it"] = BatchDecoder(own_cache_copy(loaded.target), None, None, 1,
                                                             args.max_context, compile=gpu)
    loop["plain, as step_costs builds it"] = [loop_step_ms(decoders["plain, as step_costs builds it"], prompt, a.iters)
                                              for _ in range(3)]
    result["loop_step_ms"] = {label: {"runs": ms, "median": statistics.median(ms)} for label, ms in loop.items()}
    result["prompt_tokens"] = len(prompt)
    result["kernels"] = {label: kernel_table(dec, prompt, out / f"kernels_{label.split(',')[0].replace(' ', '_')}"
                                             f"{'_step_costs' if ',' in label else ''}.txt")
                         for label, dec in decoders.items()}
    (out / "plain_loop.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
