"""Every kind of saved compiled step gives the eager greedy tokens, when compiled and when loaded.

The CI test (tests/test_lossless.py) covers plain decoding only, because compiling a chain on CPU
takes minutes. This script covers the rest on the tiny random pair in float32: a 3-step chain, a
steps table that drops to 0 steps at 3 rows (the deferred step), and a 3x4x8 tree, each at batch 1 and
at 3 rows (padded to 4, the dynamic-batch compile). Each setting decodes three times: eager, compiled
and saved by one decoder, then loaded by a second decoder over the same folder. Output:
saved_steps_kinds.txt (session 27, CPU).

    python benchmarks/results/startup/saved_steps_kinds.py
"""
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.shapes import random_pair  # noqa: E402
from engine.decoder import BatchDecoder, SpecConfig  # noqa: E402
from engine.sampling import BatchSampling  # noqa: E402

PROMPTS = [[5, 6, 7], list(range(20, 60)), [9] * 11]
CACHE = "/tmp/saved_steps_kinds"


def greedy(rows: int) -> BatchSampling:
    return BatchSampling.all_greedy_rows(rows, "cpu")


@torch.inference_mode()
def decode(target, drafter, spec, rows, **flags):
    """40 greedy tokens of each of the first `rows` prompts; the saved steps' (compiled, loaded) counts."""
    dec = BatchDecoder(target, drafter, spec, 4, 256, **flags)
    outs = [[dec.prefill(i, p, greedy(1))] for i, p in enumerate(PROMPTS[:rows])]
    while min(map(len, outs)) < 40:
        for i, r in enumerate(dec.step(rows, greedy(rows))):
            outs[i] += r.tokens
    saved = [f for f in [*dec._fns.values(), *dec._fns_rows.values()] if hasattr(f, "compiled")]
    return [o[:40] for o in outs], (sum(s.compiled for s in saved), sum(s.loaded for s in saved))


def main():
    target, drafter, _ = random_pair("tiny", "cpu", "float32")
    shutil.rmtree(CACHE, ignore_errors=True)
    for spec in (SpecConfig(3), SpecConfig(3, steps_by_batch=((1, 3), (4, 0))), SpecConfig(3, 4, 8)):
        for rows in (1, 3):
            t0 = time.time()
            eager = decode(target, drafter, spec, rows)[0]
            first, made = decode(target, drafter, spec, rows, compile=True, compile_cache=CACHE)
            second, loaded = decode(target, drafter, spec, rows, compile=True, compile_cache=CACHE)
            print(spec.label, spec.steps_by_batch, rows, "equal:", first == eager, second == eager,
                  "compiled/loaded:", made, loaded, f"{time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
