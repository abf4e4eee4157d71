"""CPU servers side by side over HTTP (the shell harness in this folder), and the summary of its rounds.

  python -m benchmarks ab OUT=DIR [SIDES="table plain"] [ROUNDS=4] [CONC="1 8"] ...   # run.sh (see it)
  python -m benchmarks ab start-times OUT=DIR                                          # start_times.sh
  python -m benchmarks ab summary OUT_DIR SIDE...                                      # what run.sh ends with

`summary`: each side's output tok/s against the base side's (BASE, default plain) in the same round,
per round and as the median of the rounds, written as summary.md (summary_BASE.md for another base)
beside the rounds' JSON (<side>_r<round>_c<concurrency>.json). CONC (default "1 8") names the
concurrencies; METRIC=decode compares the median per-request decode rate instead (summary*_decode.md).
With more than two concurrencies the medians are also plotted against concurrency (summary*.png).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def summary(out: Path, sides: list[str]) -> str:
    base = os.environ.get("BASE", "plain")
    concs = [int(c) for c in os.environ.get("CONC", "1 8").split()]
    decode = os.environ.get("METRIC") == "decode"
    others = [s for s in sides if s != base]

    def tok_s(side: str, r: int, c: int) -> float:
        s = json.loads((out / f"{side}_r{r}_c{c}.json").read_text())["summary"]
        return s["decode_tok_s"]["median"] if decode else s["output_throughput"]

    rounds = [r for r in range(1, 100) if all((out / f"{s}_r{r}_c{concs[-1]}.json").is_file() for s in sides)]
    ratios = {(s, c): [tok_s(s, r, c) / tok_s(base, r, c) for r in rounds] for s in others for c in concs}
    rows = [[str(r)] + [f"{tok_s(s, r, c):.1f}" for c in concs for s in sides]
            + [f"{ratios[(s, c)][i]:.2f}x" for c in concs for s in others] for i, r in enumerate(rounds)]
    rows.append(["median (range)"] + [""] * (len(concs) * len(sides)) + [
        f"**{statistics.median(x):.2f}x** ({min(x):.2f}-{max(x):.2f})" for c in concs for s in others
        for x in [ratios[(s, c)]]])
    head = ["round"] + [f"{s} c={c}" for c in concs for s in sides] + [f"{s} / {base} c={c}" for c in concs
                                                                       for s in others]
    text = "| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n" + "".join(
        "| " + " | ".join(r) + " |\n" for r in rows)
    stem = ("summary" if base == "plain" else f"summary_{base}") + ("_decode" if decode else "")
    (out / f"{stem}.md").write_text(text)
    if len(concs) > 2:
        from benchmarks.report import pyplot, save_figure
        fig, ax = pyplot().subplots(figsize=(6, 4))
        for s in others:
            med = [statistics.median(ratios[(s, c)]) for c in concs]
            ax.errorbar(concs, med, yerr=[[m - min(ratios[(s, c)]) for m, c in zip(med, concs)],
                                          [max(ratios[(s, c)]) - m for m, c in zip(med, concs)]],
                        marker="o", capsize=3, label=s)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xticks(concs, [str(c) for c in concs])
        ax.set(xlabel="concurrency", ylabel=f"{'decode rate' if decode else 'output tok/s'} / {base} "
                                            f"(median of {len(rounds)} rounds, range)")
        ax.legend()
        save_figure(fig, out / f"{stem}.png")
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["summary"]:
        print(summary(Path(argv[1]), argv[2:]))
        return 0
    script = "start_times.sh" if argv[:1] == ["start-times"] else "run.sh"
    settings = argv[1:] if argv[:1] == ["start-times"] else argv
    if not all("=" in s for s in settings) or not (settings or "OUT" in os.environ):
        raise SystemExit(__doc__)
    env = {**os.environ, **dict(s.split("=", 1) for s in settings)}
    return subprocess.run(["bash", str(HERE / script)], cwd=HERE.parent.parent, env=env).returncode
