"""Side by side from benchmarks.serving results named SIDE__SET__cN.json (benchmarks/gpu/run.sh): per
prompt set, a row per concurrency and a column per side (output tok/s, mean decode tok/s per request,
accept length), our best (native_plain, native_chain: as gpu-native serves it) against vLLM's best (every
side named vllm*) at each concurrency, and a plot.

  python -m benchmarks.gpu.side_by_side SWEEP_DIR [SWEEP_DIR ...] --out OUT_STEM   # OUT_STEM.json / .md / .png
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from benchmarks.report import md_table, pyplot, save_figure

NAME = re.compile(r"^(?P<side>.+)__(?P<set>[a-z]+)__c(?P<c>\d+)$")
ORDER = ("native_plain", "native_chain", "native_chain_consistent", "native_plain_eager", "native_chain_eager",
         "vllm_plain", "vllm_eagle3", "vllm_eagle", "vllm_eagle5")


SERVED = ("native_plain", "native_chain")   # the native engine as gpu-native serves it, speculating or not


def order(side: str) -> tuple:
    return (ORDER.index(side) if side in ORDER else len(ORDER), side)


def collect(folders: list[Path]) -> dict:
    """{set: {concurrency: {side: row}}}"""
    table: dict = {}
    for path in sorted(p for folder in folders for p in folder.glob("*.json")):
        m = NAME.match(path.stem)
        if not m:
            continue
        s = json.loads(path.read_text())["summary"]
        per_request = s.get("decode_tok_s") or {}
        row = {"output_tok_s": s["output_throughput"], "per_request_tok_s": per_request.get("mean"),
               "accept_length": s.get("accept_length_responses"), "completed": s["completed"], "failed": s["failed"],
               "ttft_ms_median": (s.get("ttft_ms") or {}).get("median")}
        table.setdefault(m["set"], {}).setdefault(int(m["c"]), {})[m["side"]] = row
    return table


def best(rows: dict, sides) -> tuple[str | None, float]:
    have = [(rows[s]["output_tok_s"], s) for s in sides if s in rows]
    return (max(have)[1], max(have)[0]) if have else (None, 0.0)


def markdown(table: dict) -> str:
    parts = []
    for set_, by_c in sorted(table.items()):
        sides = sorted({s for r in by_c.values() for s in r}, key=order)
        rows = []
        for c, r in sorted(by_c.items()):
            cells = [c]
            for s in sides:
                x = r.get(s)
                cells.append(None if x is None else f"{x['output_tok_s']:.0f} / {x['per_request_tok_s'] or 0:.0f}"
                             + (f" / {x['accept_length']:.2f}" if x["accept_length"] else ""))
            ours, o = best(r, SERVED)
            theirs, t = best(r, [s for s in sides if s.startswith("vllm")])
            cells += [f"{o / t:.2f}x ({ours} / {theirs})" if o and t else None]
            rows.append(cells)
        parts.append(f"### {set_}\n\nEach cell: output tok/s / mean decode tok/s per request / accept length.\n\n"
                     + md_table(["concurrency", *sides, "our best / vLLM's best"], rows))
    return "\n\n".join(parts) + "\n"


def plot(table: dict, path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(2, len(table), figsize=(6 * len(table), 8), squeeze=False)
    for j, (set_, by_c) in enumerate(sorted(table.items())):
        cs = sorted(by_c)
        for s in sorted({s for r in by_c.values() for s in r}, key=order):
            pts = [(c, by_c[c][s]) for c in cs if s in by_c[c]]
            if not pts:
                continue
            style = "-" if s.startswith("native") else "--"
            axes[0][j].plot([c for c, _ in pts], [r["output_tok_s"] for _, r in pts], style, marker="o", label=s)
            axes[1][j].plot([c for c, _ in pts], [r["per_request_tok_s"] for _, r in pts], style, marker="o", label=s)
        for i, what in enumerate(("output tok/s", "decode tok/s per request")):
            ax = axes[i][j]
            ax.set_xscale("log", base=2)
            ax.set_xticks(cs, [str(c) for c in cs])
            ax.set_xlabel("concurrent requests")
            ax.set_ylabel(what)
            ax.set_title(f"{set_}: {what}")
            ax.grid(alpha=0.3)
        axes[0][j].legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--out", required=True, help="output stem: .json, .md and .png")
    a = ap.parse_args(argv)
    table = collect([Path(f) for f in a.folders])
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(table, indent=1))
    md = markdown(table)
    out.with_suffix(".md").write_text(md)
    if table:
        plot(table, out.with_suffix(".png"))
    print(md)
    return table


if __name__ == "__main__":
    main()
