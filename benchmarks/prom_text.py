"""Read counters from a Prometheus text exposition (/metrics) without a Prometheus server.

The serving benchmark snapshots /metrics before and after a run; differences of counters
give server-side totals for exactly that run (accept length = 1 + Δaccepted / Δverify, vLLM's
window formula).
"""
from __future__ import annotations

import math
import re

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(\s+\d+)?$")

VERIFY_STEPS = "specserve_spec_verify_steps_total"
ACCEPTED = "specserve_spec_accepted_tokens_total"
PROPOSED = "specserve_spec_draft_tokens_total"
GENERATION = "specserve_generation_tokens_total"
PROMPT = "specserve_prompt_tokens_total"


def parse_totals(text: str) -> dict[str, float]:
    """Sample name -> value summed over label sets (a counter's total across labels)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isnan(value):
            continue
        totals[m.group(1)] = totals.get(m.group(1), 0.0) + value
    return totals


def deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def accept_length_from_deltas(d: dict[str, float]) -> float | None:
    """1 + Δaccepted draft tokens / Δverify steps; None when no verify step happened."""
    steps = d.get(VERIFY_STEPS, 0.0)
    if steps <= 0 or ACCEPTED not in d:
        return None
    return 1.0 + d[ACCEPTED] / steps
