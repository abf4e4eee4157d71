"""`--steps auto`: serve what the profile's step sweep measured fastest.

`benchmarks.batch_sweep --concurrency 1,2,4,... --out FILE` writes a JSON file with a "best"
record (steps, topk, draft_tokens at concurrency 1; steps 0: speculation lost to the baseline)
and, when it measured several concurrencies, "steps_by_batch" (launch/steps_table.py). The
profile names that file in `[speculative] sweep_file`, so it lives where the deployment keeps
its state, not in the source tree (the Docker image has no benchmarks/results). Without a
usable file, the profile's own steps_by_batch (or steps) stands, and the message says why.
Launch reads the file, not the benchmark code (launch/ does not import benchmarks/).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.config import parse_steps_table
from launch.profiles import Profile


@dataclass
class SweepChoice:
    steps: int          # 0: serve without speculation
    topk: int
    draft_tokens: int
    steps_by_batch: dict | None  # {"size": steps}; None: `steps` at every batch size
    source: str


def auto_setting(profile: Profile) -> tuple[SweepChoice | None, str]:
    """(the sweep's setting or None, a message saying where the choice came from)."""
    s = profile.speculative
    fallback = ("the profile's steps_by_batch" if s.steps_by_batch
                else "steps from measured costs (the profile's accept_rates)" if s.accept_rates
                else "the profile's steps")
    if not s.sweep_file:
        return None, f"--steps auto: profile {profile.name} names no speculative.sweep_file; using {fallback}"
    path = Path(s.sweep_file)
    if not path.is_file():
        return None, f"--steps auto: no step sweep at {path} (speculative.sweep_file); using {fallback}"
    try:
        result = json.loads(path.read_text())
        if result.get("synthetic_acceptance"):  # a measuring device (random weights): never served
            return None, (f"--steps auto: {path} is a SYNTHETIC-acceptance sweep of a random pair, not a measurement "
                          f"of this pair; using {fallback}")
        best = result["best"]
        table = result.get("steps_by_batch") or None
        if table is not None:
            parse_steps_table(table)
        if table is not None:  # a steps table serves chains, whatever won at concurrency 1
            steps = max(int(v) for v in table.values())
            choice = SweepChoice(steps, 1, steps + 1, table, str(path))
        else:
            choice = SweepChoice(int(best["steps"]), int(best["topk"]) or 1, int(best["draft_tokens"]), None, str(path))
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"--steps auto: cannot read a setting from {path} ({e!r}); using {fallback}"
    if choice.steps == 0:
        return choice, f"--steps auto: {path} found no speculative setting faster than none; serving without it"
    if table is not None:
        return choice, f"--steps auto: steps per batch size {table} (from {path})"
    tok_s = best.get("tok_s")
    speed = f", {float(tok_s):.1f} tok/s" if isinstance(tok_s, (int, float)) else ""
    return choice, (f"--steps auto: steps {choice.steps}, topk {choice.topk}, draft tokens {choice.draft_tokens}"
                    f" (best of {path}{speed})")
