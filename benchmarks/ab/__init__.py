"""Servers side by side over HTTP: the CPU harness in this folder (run.sh, servers.sh) and the tables of the
`serve` results it and benchmarks/gpu/run.sh write.

  python -m benchmarks ab OUT=DIR [SIDES="table plain"] [ROUNDS=4] [CONC="1 8"] ...   # run.sh (see it)
  python -m benchmarks ab summary OUT_DIR SIDE...                    # what run.sh ends with
  python -m benchmarks ab side-by-side SWEEP_DIR... --out OUT_STEM   # what benchmarks/gpu/run.sh ends with

`summary`: each side's output tok/s against the base side's (BASE, default plain) in the same round, per
round and the median of the rounds, as summary.md (summary_BASE.md for another base) beside the rounds'
results (<side>_r<round>_c<concurrency>.json); CONC (default "1 8") names the concurrencies; METRIC=decode
compares the median per-request decode rate instead (summary*_decode.md). Over more than two concurrencies
the medians are plotted too (summary*.png).

`side-by-side`: results named SIDE__SET__cN.json, per prompt set a row per concurrency and a column per side
(output tok/s / mean decode tok/s per request / accept length), our best (native_plain, native_chain: as
gpu-native serves it) against vLLM's best (every side named vllm*), as OUT_STEM.json, .md and .png.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.report import by_concurrency, md_table, pyplot, save_figure, write_result

HERE = Path(__file__).resolve().parent
SERVED = ("native_plain", "native_chain")   # the native engine as gpu-native serves it, speculating or not


def read(path: Path) -> dict:
    return json.loads(path.read_text())["summary"]


def summary(out: Path, sides: list[str]) -> str:
    base, concs = os.environ.get("BASE", "plain"), [int(c) for c in os.environ.get("CONC", "1 8").split()]
    decode = os.environ.get("METRIC") == "decode"
    others = [s for s in sides if s != base]

    def tok_s(side: str, r: int, c: int) -> float:
        s = read(out / f"{side}_r{r}_c{c}.json")
        return s["decode_tok_s"]["median"] if decode else s["output_throughput"]

    rounds = [r for r in range(1, 100) if all((out / f"{s}_r{r}_c{concs[-1]}.json").is_file() for s in sides)]
    ratios = {(s, c): [tok_s(s, r, c) / tok_s(base, r, c) for r in rounds] for s in others for c in concs}
    rows = [[r] + [f"{tok_s(s, r, c):.1f}" for c in concs for s in sides]
            + [f"{ratios[(s, c)][i]:.2f}x" for c in concs for s in others] for i, r in enumerate(rounds)]
    rows.append(["median (range)"] + [""] * (len(concs) * len(sides)) + [
        f"**{statistics.median(x):.2f}x** ({min(x):.2f}-{max(x):.2f})" for c in concs for s in others
        for x in [ratios[(s, c)]]])
    text = md_table(["round"] + [f"{s} c={c}" for c in concs for s in sides]
                    + [f"{s} / {base} c={c}" for c in concs for s in others], rows)
    stem = ("summary" if base == "plain" else f"summary_{base}") + ("_decode" if decode else "")
    (out / f"{stem}.md").write_text(text)
    if len(concs) > 2:
        fig, ax = pyplot().subplots(figsize=(6, 4))
        for s in others:
            med = [statistics.median(ratios[(s, c)]) for c in concs]
            ax.errorbar(concs, med, yerr=[[m - min(ratios[(s, c)]) for m, c in zip(med, concs)],
                                          [max(ratios[(s, c)]) - m for m, c in zip(med, concs)]],
                        marker="o", capsize=3, label=s)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        by_concurrency(ax, f"{'decode rate' if decode else 'output tok/s'} / {base} (median of {len(rounds)} rounds, "
                       "range)", concs)
        save_figure(fig, out / f"{stem}.png")
    return text


def side_by_side(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(prog="benchmarks ab side-by-side", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--out", required=True, help="output stem: .json, .md and .png")
    a = ap.parse_args(argv)
    table: dict = {}   # {set: {concurrency: {side: row}}}
    for path in sorted(p for folder in a.folders for p in Path(folder).glob("*.json")):
        if m := re.match(r"^(?P<side>.+)__(?P<set>[a-z]+)__c(?P<c>\d+)$", path.stem):
            s = read(path)
            table.setdefault(m["set"], {}).setdefault(int(m["c"]), {})[m["side"]] = {
                "output_tok_s": s["output_throughput"], "per_request_tok_s": (s.get("decode_tok_s") or {}).get("mean"),
                "accept_length": s.get("accept_length_responses"), "completed": s["completed"], "failed": s["failed"]}

    def best(rows: dict, sides) -> tuple[float, str | None]:
        return max(((rows[s]["output_tok_s"], s) for s in sides if s in rows), default=(0.0, None))

    def cell(x: dict | None) -> str | None:
        return x and f"{x['output_tok_s']:.0f} / {x['per_request_tok_s'] or 0:.0f}" + (
            f" / {x['accept_length']:.2f}" if x["accept_length"] else "")

    parts, plt = [], pyplot()
    fig, axes = plt.subplots(2, max(1, len(table)), figsize=(6 * max(1, len(table)), 8), squeeze=False)
    for j, (set_, by_c) in enumerate(sorted(table.items())):
        sides = sorted({s for r in by_c.values() for s in r}, key=lambda s: (not s.startswith("native"), s))
        rows = []
        for c, r in sorted(by_c.items()):
            (o, ours), (t, theirs) = best(r, SERVED), best(r, [s for s in sides if s.startswith("vllm")])
            rows.append([c, *(cell(r.get(s)) for s in sides), f"{o / t:.2f}x ({ours} / {theirs})" if o and t else None])
        parts.append(f"### {set_}\n\nEach cell: output tok/s / mean decode tok/s per request / accept length.\n\n"
                     + md_table(["concurrency", *sides, "our best / vLLM's best"], rows))
        for s in sides:
            pts = [(c, by_c[c][s]) for c in sorted(by_c) if s in by_c[c]]
            for i, key in enumerate(("output_tok_s", "per_request_tok_s")):
                axes[i][j].plot([c for c, _ in pts], [x[key] for _, x in pts], "-" if s.startswith("native") else "--",
                                marker="o", label=s)
        for i, what in enumerate(("output tok/s", "decode tok/s per request")):
            axes[i][j].set_title(f"{set_}: {what}")
            by_concurrency(axes[i][j], what, sorted(by_c))
    out = Path(a.out)
    write_result(out.with_suffix(".json"), table, "\n\n".join(parts) + "\n")
    save_figure(fig, out.with_suffix(".png"))
    return table


def main(argv: list[str] | None = None) -> int | dict:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["summary"]:
        print(summary(Path(argv[1]), argv[2:]))
        return 0
    if argv[:1] == ["side-by-side"]:
        return side_by_side(argv[1:])
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if not all("=" in s for s in argv) or not (argv or "OUT" in os.environ):
        raise SystemExit(__doc__)
    env = {**os.environ, **dict(s.split("=", 1) for s in argv)}
    return subprocess.run(["bash", str(HERE / "run.sh")], cwd=HERE.parent.parent, env=env).returncode
