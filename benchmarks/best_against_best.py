"""Best speculative setting against the best setting without drafts, per concurrency, from batch_sweep
JSONs: a table (.md, .json) and a plot (.png).

Each ratio pairs two rows of one sweep run (both sides in one process, interleaved). "Without drafts"
is the faster of plain decoding (either of its runs) and the speculative engine at 0 steps;
"speculative" the faster of the chains and the table the sweep chose. The EAGLE-3 paper's SGLang ratios
on Llama-3.1-8B (one H100) are drawn for reference.

  python -m benchmarks.best_against_best --sweep "1-16=PATH.json" --sweep "32=PATH2.json" \
      --curve 1-16 --curve 32 --out OUT_STEM --title "..."
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.report import md_table, pyplot, save_figure

TITLE = "best speculative / best without drafts"
PAPER = {1: 2.36, 2: 1.81, 8: 1.62, 16: 1.48, 32: 1.32}   # EAGLE-3 paper, Table 3: SGLang, Llama-3.1-8B


def best_rows(call: str, result: dict) -> list[dict]:
    out = []
    rows = result["rows"] + result["table_rows"]
    for c in sorted({r["concurrency"] for r in rows}):
        at = [r for r in rows if r["concurrency"] == c]
        plain = max((r for r in at if r["steps"] == 0), key=lambda r: r["throughput"])
        spec = max((r for r in at if r["steps"] > 0), key=lambda r: r["throughput"])
        out.append({"call": call, "concurrency": c, "no drafts": plain["setting"],
                    "no drafts tok/s": plain["throughput"], "speculative": spec["setting"],
                    "speculative tok/s": spec["throughput"], "x throughput": spec["throughput"] / plain["throughput"],
                    "x per request": spec["request_tok_s"] / plain["request_tok_s"],
                    "accept length": spec["accept_length"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", action="append", required=True,
                    help="LABEL=PATH of a batch_sweep JSON (repeatable)")
    ap.add_argument("--curve", action="append", default=[], help="a LABEL whose rows the plot joins")
    ap.add_argument("--out", required=True, help="the stem of .md, .json and .png")
    ap.add_argument("--title", default=TITLE)
    a = ap.parse_args()
    sweeps = dict(s.split("=", 1) for s in a.sweep)
    curve = a.curve or list(sweeps)
    out = Path(a.out)
    rows = [r for call, path in sweeps.items() for r in best_rows(call, json.loads(Path(path).read_text()))]
    cols = list(rows[0])
    body = [[f"{v:.2f}x" if k.startswith("x ") else f"{v:.2f}" if k == "accept length" else
             f"{v:.1f}" if isinstance(v, float) else v for k, v in r.items()] for r in rows]
    out.with_suffix(".md").write_text(md_table(cols, body) + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    sweep = sorted((r for r in rows if r["call"] in curve), key=lambda r: r["concurrency"])
    cs = [r["concurrency"] for r in sweep]
    ax.plot(cs, [r["speculative tok/s"] for r in sweep], "r-o", label="best speculative")
    ax.plot(cs, [r["no drafts tok/s"] for r in sweep], "k--o", label="best without drafts")
    ax2.plot(cs, [r["x throughput"] for r in sweep], "r-o", label="throughput ratio")
    ax2.plot(cs, [r["x per request"] for r in sweep], "m:o", label="per-request ratio")
    ax2.plot(list(PAPER), list(PAPER.values()), "b--", alpha=0.5, label="EAGLE-3 paper, SGLang, Llama-3.1-8B")
    for axes, label in ((ax, "output throughput, tok/s"), (ax2, "best speculative / best without drafts")):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("concurrency")
        axes.set_ylabel(label)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    ax2.axhline(1.0, color="gray", lw=0.8)
    fig.suptitle(a.title)
    save_figure(fig, out.with_suffix(".png"))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
