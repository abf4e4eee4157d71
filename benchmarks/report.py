"""Output helpers shared by the benchmark scripts: JSON, markdown tables, headless plots."""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from benchmarks.manifest import typed_command


def provenance(argv: list[str] | None = None) -> dict:
    """Who/when/how a result was made, so a committed JSON says its own command."""
    return {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
            "python": platform.python_version(), "command": typed_command(argv)}


def write_json(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")
    return path


def write_result(path: Path, result: dict, markdown: str, plot=None) -> Path:
    """A tool's outputs side by side: the result as JSON at `path` (….json), its markdown
    beside it (.md, also printed) and, given `plot(result, png_path)`, its figure (.png)."""
    write_json(path, result)
    path.with_suffix(".md").write_text(markdown)
    if plot is not None:
        plot(result, path.with_suffix(".png"))
    print(markdown)
    print(f"wrote {path}")
    return path


def _jsonable(o):
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "__dataclass_fields__"):
        from dataclasses import asdict
        return asdict(o)
    return str(o)


def md_table(headers: list[str], rows: list[list]) -> str:
    def cell(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
        return str(v)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


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
