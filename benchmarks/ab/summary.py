"""run.sh's rounds: each side's output tok/s against the base side's (BASE, default plain) in the
same round, per round and as the median of the rounds, written as summary.md (summary_BASE.md for
another base) beside the rounds' JSON (<side>_r<round>_c<concurrency>.json).
CONC (default "1 8") names the concurrencies; METRIC=decode compares the median per-request decode
rate instead of output tok/s, written as summary_decode.md (summary_BASE_decode.md).
With more than two concurrencies the medians are also plotted against concurrency (summary*.png).

  python benchmarks/ab/summary.py OUT_DIR table plain [table_t2 ...]
  BASE=plain_t2 python benchmarks/ab/summary.py OUT_DIR table plain plain_t2
"""
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.report import pyplot, save_figure  # noqa: E402

out, sides = Path(sys.argv[1]), sys.argv[2:]
base = os.environ.get("BASE", "plain")
concs = [int(c) for c in os.environ.get("CONC", "1 8").split()]
decode = os.environ.get("METRIC") == "decode"
others = [s for s in sides if s != base]


def tok_s(side: str, r: int, c: int) -> float:
    summary = json.loads((out / f"{side}_r{r}_c{c}.json").read_text())["summary"]
    return summary["decode_tok_s"]["median"] if decode else summary["output_throughput"]


rounds = [r for r in range(1, 100) if all((out / f"{s}_r{r}_c{concs[-1]}.json").is_file() for s in sides)]
head = (["round"] + [f"{s} c={c}" for c in concs for s in sides]
        + [f"{s} / {base} c={c}" for c in concs for s in others])
rows, ratios = [], {(s, c): [] for s in others for c in concs}
for r in rounds:
    cells = [f"{tok_s(s, r, c):.1f}" for c in concs for s in sides]
    for c in concs:
        for s in others:
            ratios[(s, c)].append(tok_s(s, r, c) / tok_s(base, r, c))
    cells += [f"{ratios[(s, c)][-1]:.2f}x" for c in concs for s in others]
    rows.append([str(r)] + cells)
med = [f"**{statistics.median(ratios[(s, c)]):.2f}x** ({min(ratios[(s, c)]):.2f}-{max(ratios[(s, c)]):.2f})"
       for c in concs for s in others]
rows.append(["median (range)"] + [""] * (len(concs) * len(sides)) + med)
text = "| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n" + "".join(
    "| " + " | ".join(r) + " |\n" for r in rows)
stem = ("summary" if base == "plain" else f"summary_{base}") + ("_decode" if decode else "")
(out / f"{stem}.md").write_text(text)
print(text)
if len(concs) > 2:
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for s in others:
        r = [ratios[(s, c)] for c in concs]
        med_s = [statistics.median(x) for x in r]
        ax.errorbar(concs, med_s, yerr=[[m - min(x) for m, x in zip(med_s, r)], [max(x) - m for m, x in zip(med_s, r)]],
                    marker="o", capsize=3, label=s)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(concs, [str(c) for c in concs])
    ax.set_xlabel("concurrency")
    ax.set_ylabel(f"{'decode rate' if decode else 'output tok/s'} / {base} (median of {len(rounds)} rounds, range)")
    ax.legend()
    save_figure(fig, out / f"{stem}.png")
