"""`--steps auto`: take the fastest speculative setting from the profile's step sweep.

benchmarks/step_sweep.py writes benchmarks/results/step_sweep/<profile>.json whose "best"
record holds steps, topk and draft_tokens (steps 0: speculation lost to the baseline on that
machine). Launch reads the file, not the benchmark code (launch/ does not import benchmarks/).
Without a usable sweep the profile's own setting stands, and the message says why.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from launch.profiles import PROJECT_ROOT

SWEEP_DIR = PROJECT_ROOT / "benchmarks" / "results" / "step_sweep"


@dataclass
class SweepChoice:
    steps: int          # 0: serve without speculation
    topk: int
    draft_tokens: int
    source: str


def best_setting(profile: str, sweep_dir: Path = SWEEP_DIR) -> tuple[SweepChoice | None, str]:
    """(the sweep's best setting or None, a message saying where the choice came from)."""
    path = Path(sweep_dir) / f"{profile}.json"
    if not path.is_file():
        return None, f"--steps auto: no step sweep for {profile!r} at {path}; using the profile's steps"
    try:
        best = json.loads(path.read_text())["best"]
        choice = SweepChoice(int(best["steps"]), int(best["topk"]), int(best["draft_tokens"]), str(path))
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"--steps auto: cannot read a best setting from {path} ({e!r}); using the profile's steps"
    if choice.steps == 0:
        return choice, f"--steps auto: {path} found no speculative setting faster than none; serving without it"
    tok_s = best.get("tok_s")
    speed = f", {float(tok_s):.1f} tok/s" if isinstance(tok_s, (int, float)) else ""
    return choice, (f"--steps auto: steps {choice.steps}, topk {choice.topk}, draft tokens {choice.draft_tokens}"
                    f" (best of {path}{speed})")
