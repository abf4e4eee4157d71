"""Does plain decoding's one-row step vary between compiles of the same code? Sessions 34 and 36 saw plain
decoding at one request run 8-27% below the speculative engine at 0 steps, and session 35 saw the two level
(../h200_s36/README.md). This compiles one plain one-row decoder, as step_costs builds it, in a process of its
own; run.sh starts it several times, each over an empty inductor cache, so each is a compile of its own:

  python benchmarks/results/h200_s37/plain_compiles.py --model runs/smollm2/target --tuning default \\
      --out $OUT/plain_compiles/default_1.json

--tuning off compiles without decoder.COMPILE_OPTIONS (no coordinate-descent tuning, no benchmarked fusion),
to see whether the tuning is where compiles differ. Each process times the step five times
(step_costs.loop_step_ms, launched ahead as the engine's loop runs it) and profiles one more call: its
kernels and their GPU time per step, written beside the JSON.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.engine_load import load_prompts
from benchmarks.step_costs import loop_step_ms
from engine import decoder as decoder_module
from engine.decoder import BatchDecoder
from engine.loading import LoadedModels, NativeEngineArgs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "h200_s35"))
from plain_loop import kernel_table  # noqa: E402  (session 35's profile of one loop_step_ms call)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tuning", choices=("default", "off"), default="default")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--device", default="cuda", help="cpu: a quick check of the script (float32)")
    ap.add_argument("--out", required=True, help="a .json file")
    a = ap.parse_args()
    if a.tuning == "off":
        decoder_module.COMPILE_OPTIONS.clear()
    gpu = a.device == "cuda"
    loaded = LoadedModels.load(NativeEngineArgs(model=a.model, device=a.device,
                                                dtype="bfloat16" if gpu else "float32"))
    prompt = load_prompts("shipped/smollm2/heldout/chat.jsonl", loaded.tokenizer, 1)[0]
    dec = BatchDecoder(loaded.target, None, None, 1, 1024, compile=True)
    t0 = time.perf_counter()
    first = loop_step_ms(dec, prompt, 1)   # compiles
    compile_s = time.perf_counter() - t0
    runs = [loop_step_ms(dec, prompt, a.iters) for _ in range(5)]
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"gpu": torch.cuda.get_device_name() if gpu else None, "torch": torch.__version__,
              "tuning": a.tuning, "compile_options": dict(decoder_module.COMPILE_OPTIONS),
              "compile_and_first_call_s": round(compile_s, 1), "first_ms": first,
              "loop_step_ms": {"runs": runs, "median": statistics.median(runs)},
              "prompt_tokens": len(prompt),
              "kernels": kernel_table(dec, prompt, out.with_suffix(".kernels.txt"))}
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
