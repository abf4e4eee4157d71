"""The ablation's table (markdown, to stdout) and figure (accept_length.png) from raw/eval_*.json.

Each cell: accept length (tokens per verify, bonus included) and its standard error over verify
steps, the variance taken from the per-position acceptance (E[L^2] = sum_i (2i+1) P(L > i)). Verify
steps within a prompt are correlated, so this understates the noise between prompt sets.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETS = ("chat", "mtbench", "humaneval", "completion")


def arm(draft: str) -> str:
    return "shipped (no fine-tune)" if draft.rstrip("/").endswith("smollm2/drafter") else Path(draft).name


def stderr(r: dict) -> float:
    """Standard error of the accept length: per verify step the tokens made are 1 + accepted drafts,
    whose variance follows from the per-position acceptance (acceptance at position i+1 implies i)."""
    p = [1.0] + list(r["per_position"])
    mean = sum(p)
    second = sum((2 * i + 1) * p[i] for i in range(len(p)))   # E[L^2] = sum_i (2i+1) P(L > i)
    return math.sqrt(max(0.0, second - mean * mean) / max(1, r["verify_steps"]))


def load(tag: str = "") -> dict:
    cells = {}
    for s in SETS:
        f = HERE / "raw" / f"eval_{s}{tag}.json"
        if not f.exists():
            continue
        for r in json.loads(f.read_text()):
            cells[(arm(r["draft"]), s, r["steps"])] = r
    return cells


def table(cells: dict) -> str:
    arms = list(dict.fromkeys(a for a, _, _ in cells))
    steps = sorted({k for _, _, k in cells})
    sets = [s for s in SETS if any(c[1] == s for c in cells)]
    head = "| arm | " + " | ".join(f"{s} @{k}" for s in sets for k in steps) + " |"
    lines = [head, "|" + "---|" * (1 + len(sets) * len(steps))]
    for a in arms:
        row = []
        for s in sets:
            for k in steps:
                r = cells.get((a, s, k))
                row.append("" if r is None else f"{r['accept_length']:.3f} ± {stderr(r):.3f}")
        lines.append(f"| {a} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(cells: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    arms = list(dict.fromkeys(a for a, _, _ in cells))
    sets = [s for s in SETS if any(c[1] == s for c in cells)]
    steps = sorted({k for _, _, k in cells})
    fig, axes = plt.subplots(1, len(steps), figsize=(6 * len(steps), 4), sharey=True)
    axes = axes if len(steps) > 1 else [axes]
    w = 0.8 / max(1, len(arms))
    for ax, k in zip(axes, steps):
        for j, a in enumerate(arms):
            xs = [i + j * w for i in range(len(sets))]
            ys = [cells[(a, s, k)]["accept_length"] if (a, s, k) in cells else 0 for s in sets]
            es = [stderr(cells[(a, s, k)]) if (a, s, k) in cells else 0 for s in sets]
            ax.bar(xs, ys, w, yerr=es, label=a, capsize=2)
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(sets))], sets)
        ax.set_title(f"{k} draft steps (greedy, CPU, bf16)")
        ax.set_ylabel("accept length (tokens per verify)")
        ax.set_ylim(1, 3.5)
    axes[-1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def repeats(cells: dict, again: dict) -> list[str]:
    """Cells of drafters evaluated in both runs whose accept lengths differ."""
    return [f"{k}: {cells[k]['accept_length']} vs {again[k]['accept_length']}" for k in again
            if k in cells and cells[k]["accept_length"] != again[k]["accept_length"]]


if __name__ == "__main__":
    # the main run, then the combination's (run.sh TAG=_combo), which evaluated base again
    cells, combo = load(), load("_combo")
    differ = repeats(cells, combo)
    cells.update({k: v for k, v in combo.items() if k[0] == "combo"})
    print(table(cells))
    print(f"\ndrafters evaluated in both runs: {len(differ)} cells differ" + "".join("\n  " + d for d in differ))
    plot(cells, HERE / "accept_length.png")
