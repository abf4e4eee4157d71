"""Accept length against draft steps, one line per (prompt set, drafter), from `drafter eval` JSON.

    python -m benchmarks.plot_accept RUN/eval_{chat,humaneval,completion}.json --out RUN/accept_by_steps.png

A set is named by its file (eval_chat.json -> chat); with more than one drafter in a file each
line also names its drafter's folder.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.report import pyplot, save_figure


def lines(path: Path) -> dict[str, list[tuple[int, float]]]:
    rows = json.loads(path.read_text())
    drafts = sorted({r["draft"] for r in rows})
    name = path.stem.removeprefix("eval_").removeprefix("cpu_")
    out: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        label = name if len(drafts) == 1 else f"{name}: {Path(r['draft']).name}"
        out.setdefault(label, []).append((r["steps"], r["accept_length"]))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("evals", nargs="+", type=Path, help="drafter eval --out files")
    ap.add_argument("--out", type=Path, required=True, help="the PNG")
    ap.add_argument("--title", default="held-out accept length (bonus token included)")
    a = ap.parse_args(argv)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for path in a.evals:
        for label, points in lines(path).items():
            steps, accept = zip(*sorted(points))
            ax.plot(steps, accept, marker="o", label=label)
    ax.set_xlabel("draft steps (chain)")
    ax.set_ylabel("accept length")
    ax.set_title(a.title)
    ax.grid(alpha=0.3)
    ax.legend()
    print(save_figure(fig, a.out))


if __name__ == "__main__":
    main()
