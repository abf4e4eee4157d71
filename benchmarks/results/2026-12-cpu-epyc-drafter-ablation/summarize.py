"""The ablation's table (markdown, to stdout) and figure (accept_length.png) from raw/eval_*.json: the main run,
then the combination's (run.sh TAG=_combo), which evaluated base again.

Each cell: accept length (tokens per verify, bonus included) and its standard error over verify steps, the
variance taken from the per-position acceptance: acceptance at position i+1 implies i, so
E[L^2] = sum_i (2i+1) P(L > i). Verify steps within a prompt are correlated: this understates the noise
between prompt sets.
"""
import json
import math
from pathlib import Path

import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parent
SETS = ("chat", "mtbench", "humaneval", "completion")


def stderr(r: dict) -> float:
    p = [1.0, *r["per_position"]]
    second = sum((2 * i + 1) * x for i, x in enumerate(p))
    return math.sqrt(max(0.0, second - sum(p) ** 2) / max(1, r["verify_steps"]))


def load(tag: str = "") -> dict:
    """(arm, set, steps) -> that drafter's result."""
    return {("shipped (no fine-tune)" if r["draft"].rstrip("/").endswith("smollm2/drafter") else Path(r["draft"]).name,
             s, r["steps"]): r
            for s in SETS if (f := HERE / "raw" / f"eval_{s}{tag}.json").exists() for r in json.loads(f.read_text())}


cells, combo = load(), load("_combo")
differ = [f"{k}: {cells[k]['accept_length']} vs {v['accept_length']}" for k, v in combo.items()
          if k in cells and cells[k]["accept_length"] != v["accept_length"]]
cells.update({k: v for k, v in combo.items() if k[0] == "combo"})
arms, steps = list(dict.fromkeys(a for a, _, _ in cells)), sorted({k for _, _, k in cells})
sets = [s for s in SETS if any(c[1] == s for c in cells)]
print("| arm | " + " | ".join(f"{s} @{k}" for s in sets for k in steps) + " |")
print("|" + "---|" * (1 + len(sets) * len(steps)))
for a in arms:
    print(f"| {a} | " + " | ".join("" if (r := cells.get((a, s, k))) is None else
                                  f"{r['accept_length']:.3f} ± {stderr(r):.3f}" for s in sets for k in steps) + " |")
print(f"\ndrafters evaluated in both runs: {len(differ)} cells differ" + "".join("\n  " + d for d in differ))

plt.switch_backend("Agg")
fig, axes = plt.subplots(1, len(steps), figsize=(6 * len(steps), 4), sharey=True, squeeze=False)
w = 0.8 / max(1, len(arms))
for ax, k in zip(axes[0], steps):
    for j, a in enumerate(arms):
        rs = [cells.get((a, s, k)) for s in sets]
        ax.bar([i + j * w for i in range(len(sets))], [r["accept_length"] if r else 0 for r in rs], w,
               yerr=[stderr(r) if r else 0 for r in rs], label=a, capsize=2)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(sets))], sets)
    ax.set(title=f"{k} draft steps (greedy, CPU, bf16)", ylabel="accept length (tokens per verify)", ylim=(1, 3.5))
axes[0][-1].legend(fontsize=7, loc="upper right")
fig.tight_layout()
fig.savefig(HERE / "accept_length.png", dpi=110)
