"""Steps per batch size from this machine's step costs and the drafter's acceptance.

A table swept on one machine can lose on another: a table swept on an Intel Xeon VM ran at
0.69-0.90x plain decoding at 4-32 requests on an AMD EPYC VM, where a product of up to 4 rows
costs what one row does and 12-32 rows 3.0-4.5 times as much. So,
as vLLM's dynamic speculation does with its measured cost per batch size and token count, the
engine times its own steps at load, at each power-of-two batch size and each step count from 0
to `steps`. At each batch size it then drafts the steps with the most tokens per second (more steps must give
MIN_GAIN more than fewer):

    tokens(s) = 1 + accept_rates[0] + ... + accept_rates[s-1]
    steps(b)  = argmax over s of tokens(s) / cost(b, s)

accept_rates[i] is the share of verifies whose first i+1 drafts are accepted, measured for the
drafter (SpecConfig.accept_rates). cost(b, 0) is the speculative engine's step at 0 drafts: the
target alone, the drafter reading its backlog when it is full. Costs are taken as the
loop pays them (device-side greedy steps, the host's read included). They are taken at a fixed
context of CONTEXT tokens, the rows rewound after each step, and kept per machine
(models/kept_measurements.py). Greedy outputs do not depend on the table (tests/test_lossless.py).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterator, Sequence

import torch

from engine.decode_state import BACKLOG_STEPS
from engine.decoder import BatchDecoder
from engine.sampling import BatchSampling
from engine.saved_compile import code_fingerprint
from models.kept_measurements import kept_entry_if_any, kept_measurement, processor
from models.layers import own_cache_copy

CONTEXT = 256   # tokens in each row while its steps are timed: a chat prompt and its reply
ROUNDS = 4      # the step counts take turns this many times; each keeps its fastest round
BLOCK = 4       # steps timed per round at 1 or more drafts (BACKLOG_STEPS at 0)
# More drafts must predict this much more speed than fewer. The prediction leaves out admission
# and a batch's tail, and measured ratios come out below it (1.59x for a predicted 1.74x at one
# request on CPU; at 8 rows a predicted 1.05x over 0 steps ran at 0.85-0.89x plain decoding over
# HTTP). So a near-tie drafts less.
MIN_GAIN = 0.10


def batch_sizes(max_batch: int) -> list[int]:
    """The table's sizes: powers of two up to max_batch, and max_batch."""
    sizes = [1 << i for i in range(max_batch.bit_length()) if 1 << i < max_batch]
    return sizes + [max_batch]


def measure_costs(dec: BatchDecoder, sizes: Sequence[int], rounds: int = ROUNDS) -> dict[int, list[float]]:
    """ms per engine step at each batch size and each step count 0..spec.steps.

    The step counts take turns, `rounds` times. Each turn runs one untimed step (a change of
    step count can make the drafter read its backlog), then times a block of steps. At
    0 steps the block is BACKLOG_STEPS steps: with graphs or compile they hold exactly one backlog
    read; without (CPU), whose backlog holds EAGER_BACKLOG_STEPS, none, and one backlog read per 128
    steps costs no more. A step count keeps its fastest block: other work on the machine only adds
    time (a shared VM can run one step count 40-70% slow in a single block). Leaves every row
    empty and the decoder's own speculative setting in force."""
    costs: dict[int, list[float]] = {}
    for _ in cost_slices(dec, sizes, costs, rounds):
        pass
    return costs


@torch.inference_mode()
def cost_slices(dec: BatchDecoder, sizes: Sequence[int], costs: dict, rounds: int = ROUNDS) -> Iterator[None]:
    """measure_costs a slice at a time, filling `costs`: it yields after each prompt prefilled and
    each step, so a serving engine thread can run its own steps between slices (engine/tuning.py,
    with `dec` a decoder of its own); a block's time is the sum of its own steps' times."""
    own = dec.spec
    prompt = [i % dec.target.config.vocab_size for i in range(1, min(CONTEXT, dec.cache_len // 2) + 1)]
    filled = 0
    for rows in sizes:
        for row in range(filled, rows):  # a step rewound writes only past the prompt: rows stay filled
            dec.prefill(row, prompt, BatchSampling.all_greedy_rows(1, dec.device))
            yield
        filled = max(filled, rows)
        start = dec.lens[:rows]
        best = [float("inf")] * (own.steps + 1)
        for _ in range(rounds):
            for steps in range(len(best)):
                dec.set_steps_table(((dec.max_batch, steps),))
                n = BACKLOG_STEPS if steps == 0 else BLOCK
                took = 0.0
                for i in range(1 + n):
                    dec.lens[:rows] = start
                    t0 = time.perf_counter()
                    dec.collect(dec.launch(rows))
                    took += (time.perf_counter() - t0) if i else 0.0
                    yield
                best[steps] = min(best[steps], took * 1000 / n)
        costs[rows] = best
    dec.spec = own
    dec.empty_rows()


def choose_steps(costs: dict[int, list[float]], accept_rates: Sequence[float],
                 min_gain: float = MIN_GAIN) -> tuple[tuple[int, int], ...]:
    """((batch size, steps), ...): at each size the steps with the most tokens per ms, where more
    steps must give `min_gain` more than the best with fewer."""
    table = []
    for rows, ms in sorted(costs.items()):
        speed = [(1 + sum(accept_rates[:s])) / cost for s, cost in enumerate(ms)]
        best = 0
        for s in range(1, len(ms)):
            if speed[s] > (1 + min_gain) * speed[best]:
                best = s
        table.append((rows, best))
    return tuple(table)


def provisional_steps(steps: int, max_batch: int) -> tuple[tuple[int, int], ...]:
    """The table served until this machine's costs are measured (engine/tuning.py): `steps` for one
    request, one draft step from two rows on. One draft step costs least where a verify's rows cost
    more than drafts give (on CPU, at the larger batches), and still gains where they do not."""
    return ((1, steps),) if max_batch == 1 else ((1, steps), (max_batch, min(1, steps)))


def costs_key(dec: BatchDecoder, model: str, draft: str, sizes: Sequence[int]) -> str:
    """What the costs depend on: the machine, the pair and its shapes, the engine's code."""
    device = torch.cuda.get_device_name(dec.device) if dec.device.type == "cuda" else processor()
    return json.dumps([device, torch.get_num_threads(), torch.__version__, str(dec.target.embed_tokens.weight.dtype),
                       model, draft, list(sizes), dec.spec.steps, CONTEXT, code_fingerprint()])


def eager_twin(dec: BatchDecoder) -> BatchDecoder:
    """An uncompiled decoder over `dec`'s models, with caches of its own just long enough for
    measure_costs. A compiled engine's table comes from its twin's costs: timing every step count
    compiled would compile each one (minutes on CPU). Compiling speeds up steps with drafts more
    than plain ones on CPU, so eager costs draft no more than compiled ones would."""
    return BatchDecoder(own_cache_copy(dec.target), own_cache_copy(dec.drafter), dec.spec, dec.max_batch,
                        max_context=2 * CONTEXT)


def costs_path(folder: str) -> Path:
    return Path(folder) / "step_costs.json"


def kept_costs(dec: BatchDecoder, model: str, draft: str, folder: str | None) -> dict[int, list[float]]:
    """measure_costs at batch_sizes(max_batch), kept in `folder`/step_costs.json (None: measured
    here, not kept). A compiled decoder's costs are its eager twin's, under the same key; the twin
    is made only when they are measured, not on a start that reads them."""
    sizes = batch_sizes(dec.max_batch)

    def costs() -> dict[int, list[float]]:
        return measure_costs(eager_twin(dec) if dec.compiled else dec, sizes)

    if not folder:
        return costs()
    entry = kept_measurement(costs_path(folder), costs_key(dec, model, draft, sizes), lambda: costs_entry(costs()),
                             "step costs per batch size")
    return from_entry(entry)


def costs_entry(costs: dict[int, list[float]]) -> dict:
    """What the tuning cache keeps of measured costs."""
    return {"ms": {rows: [round(c, 3) for c in ms] for rows, ms in costs.items()}}


def from_entry(entry: dict) -> dict[int, list[float]]:
    return {int(rows): ms for rows, ms in entry["ms"].items()}


def kept_costs_if_any(dec: BatchDecoder, model: str, draft: str, folder: str) -> dict[int, list[float]] | None:
    """The costs kept in `folder` for this machine, pair and code, or None where none are kept yet."""
    entry = kept_entry_if_any(costs_path(folder), costs_key(dec, model, draft, batch_sizes(dec.max_batch)))
    return from_entry(entry) if entry else None
