"""Draft steps per batch size: the profile's table in each engine's own form.

Speculation pays less as the batch grows (every row shares each forward's weight reads, so a
verify forward's extra tokens stop being free), so the step count that is fastest alone can
be slower than none at load. The profile holds `[speculative] steps_by_batch = { "1" = 5,
"8" = 3, "32" = 0 }`: a step of B rows drafts the steps of the first entry with B <= its
size, the last entry beyond (0: no drafts). `benchmarks.batch_sweep` measures
it and writes it to the profile's `sweep_file`, which `--steps auto` reads.

  native  engine.config.SpecConfig.steps_by_batch: ((size, steps), ...), read from the profile's
          table by engine.config.parse_steps_table
  vLLM    speculative_config["num_speculative_tokens_per_batch_size"]: [(first, last, k), ...]
          (inclusive batch-size ranges, the last one carried forward; vllm/v1/spec_decode/dynamic)
  SGLang  speculative_adaptive with a speculative_adaptive_config JSON: {"<smallest batch size>":
          {"candidate_steps": [k]}} (a slot serves sizes from its key up to the next key; one
          candidate pins the step count, so SGLang's acceptance-driven adaptation does not move it)
"""
from __future__ import annotations

from engine.config import StepsTable as Table


def vllm_schedule(table: Table) -> list[tuple[int, int, int]]:
    """vLLM's inclusive ranges; the first starts at 1 as vLLM requires."""
    out, first = [], 1
    for size, steps in table:
        out.append((first, size, steps))
        first = size + 1
    return out


def sglang_adaptive_config(table: Table) -> dict:
    """SGLang's adaptive config: slots keyed by the smallest batch size they serve."""
    out, first = {}, 1
    for size, steps in table:
        out[str(first)] = {"candidate_steps": [steps]}
        first = size + 1
    return out


def sglang_adaptive_file(table: Table) -> str:
    """SGLang reads the adaptive config from a file: write it (named by its content, so every
    launch of one table shares one file) and return its path."""
    import hashlib
    import json
    import tempfile
    from pathlib import Path

    text = json.dumps(sglang_adaptive_config(table), indent=1) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"specserve-sglang-adaptive-{digest}.json"
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return str(path)
