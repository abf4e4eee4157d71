"""A result's files: its JSON, its markdown beside it (printed too) and, where it has one, its plot."""
from __future__ import annotations

import dataclasses
import json
import platform
import time
from pathlib import Path

from benchmarks.manifest import typed_command, write_manifest


def provenance(argv: list[str] | None = None) -> dict:
    """When, where and how a result was made, so a committed JSON says its own command."""
    return {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
            "python": platform.python_version(), "command": typed_command(argv)}


def write_json(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=lambda o: dataclasses.asdict(o)
                               if dataclasses.is_dataclass(o) else str(o)) + "\n")
    return path


def write_result(path: Path, result, markdown: str, plot=None, *, claim: str | None = None) -> Path:
    """`result` as JSON at `path`, `markdown` beside it (.md), given `plot(result, png_path)` its .png and, given
    the claim it backs, manifest.json in its folder (with the command in the result's provenance)."""
    write_json(path, result)
    path.with_suffix(".md").write_text(markdown)
    if plot is not None:
        plot(result, path.with_suffix(".png"))
    if claim:
        write_manifest(path.parent, claim, (result.get("provenance") or {}).get("command") if isinstance(result, dict)
                       else None)
    print(f"{markdown}\nwrote {path}")
    return path


def md_table(headers: list[str], rows: list[list]) -> str:
    def cell(v):
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
        return "-" if v is None else str(v)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(map(cell, r)) + " |" for r in rows]) + "\n"


def pyplot():
    """matplotlib.pyplot on the headless Agg backend (benchmarks run on servers)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: Path) -> Path:
    """Lay out, write the PNG and free the figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def by_concurrency(ax, ylabel: str, concurrencies: list[int] | None = None) -> None:
    """An axis over concurrency: log 2 scale, labels, grid, legend."""
    ax.set_xscale("log", base=2)
    if concurrencies:
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
    ax.set(xlabel="concurrency", ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
