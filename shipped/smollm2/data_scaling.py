#!/usr/bin/env python3
"""Accept length against training-data size: one drafter per sample count, same recipe (the
evals stage of gpu_build.sh, after its train stage; the largest drafter ships).

For each N, `drafter train --limit-samples N` (the first N conversations, `--epochs` passes),
`drafter export`, then `drafter eval` on held-out prompts at steps 1..6. `--jobs` trains that
many sizes at once, each followed by its eval (on one GPU, a small drafter's run leaves it
mostly idle).
Resumable: an N whose eval JSON is in the work dir is not trained again (copy earlier runs' JSON
there to add a size to their table), a run directory is resumed. Writes a JSON
table, markdown and a PNG plot to --out-dir.

  python shipped/smollm2/data_scaling.py --target shipped/target --data runs/scaling/data \
      --sizes 250,500,1000,2000 --out-dir benchmarks/results/data_scaling
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.report import pyplot, save_figure


def run(args: list[str], log: Path | None = None) -> None:
    """One `drafter` command; output to `log` (concurrent runs) or to this terminal."""
    print("+", " ".join(args), flush=True)
    if log is None:
        subprocess.run([sys.executable, "-m", "drafter", *args], check=True)
        return
    with open(log, "a") as out:
        subprocess.run([sys.executable, "-m", "drafter", *args], check=True, stdout=out, stderr=subprocess.STDOUT)


def train_one(a, n: int, work: Path) -> Path:
    """Train and export the drafter for the first n conversations (resumes a run directory)."""
    run_dir, draft = work / f"run_{n}", work / f"drafter_{n}"
    if (draft / "config.json").is_file():
        return draft
    resume = ["--resume"] if run_dir.is_dir() else []
    log = work / f"train_{n}.log"
    run(["train", "--target", a.target, "--data", a.data, "--out", str(run_dir), "--limit-samples", str(n),
         "--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--max-length", str(a.max_length),
         "--ttt-length", str(a.ttt_length), "--lr", str(a.lr), "--save-every", str(a.save_every),
         "--log-every", "50", "--device", a.device, *resume], log)
    run(["export", str(run_dir), str(draft), "--dtype", a.export_dtype], log)
    return draft


def size_result(a, n: int, work: Path) -> list[dict]:
    """The held-out eval of size n: from an earlier run if its JSON is in the work dir (nothing
    trained again), else train, export and evaluate."""
    result = work / f"eval_{n}.json"
    if result.is_file():
        return json.loads(result.read_text())
    return eval_one(a, n, train_one(a, n, work), work)


def eval_one(a, n: int, draft: Path, work: Path) -> list[dict]:
    result = work / f"eval_{n}.json"
    if not result.is_file():
        run(["eval", "--target", a.target, "--draft", str(draft), "--prompts", a.prompts, "--steps", a.steps,
             "--max-tokens", str(a.max_tokens), "--limit", str(a.eval_prompts), "--device", a.device,
             "--max-batch", str(a.eval_prompts or 256), "--out", str(result)], work / f"eval_{n}.log")
    return json.loads(result.read_text())


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for steps in sorted({r["steps"] for r in rows}):
        pts = sorted((r["samples"], r["accept_length"]) for r in rows if r["steps"] == steps)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{steps} steps")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("training conversations")
    ax.set_ylabel("accept length (held-out, greedy)")
    ax.set_title("Drafter accept length vs training-data size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="shipped/target")
    ap.add_argument("--data", required=True, help="a `drafter data` directory with its draft vocabulary")
    ap.add_argument("--prompts", default="shipped/data/heldout_prompts.jsonl")
    ap.add_argument("--sizes", default="250,500,1000,2000")
    ap.add_argument("--steps", default="1,2,3,4,5,6")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--ttt-length", type=int, default=7)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--save-every", type=int, default=50)
    ap.add_argument("--export-dtype", default="float32")
    ap.add_argument("--jobs", type=int, default=1, help="sizes trained at once")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--eval-prompts", type=int, default=24)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out-dir", default="benchmarks/results/data_scaling")
    ap.add_argument("--work-dir", default="runs/data_scaling")
    a = ap.parse_args(argv)
    work, out = Path(a.work_dir), Path(a.out_dir)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in a.sizes.split(",")]
    with ThreadPoolExecutor(a.jobs) as pool:
        evals = list(pool.map(lambda n: size_result(a, n, work), sizes))
    rows = [{"samples": n, "steps": r["steps"], "accept_length": r["accept_length"], "per_position": r["per_position"]}
            for n, results in zip(sizes, evals) for r in results]
    (out / "data_scaling.json").write_text(json.dumps({"command": " ".join(sys.argv), "args": vars(a),
                                                        "rows": rows}, indent=2) + "\n")
    steps = sorted({r["steps"] for r in rows})
    lines = ["| samples | " + " | ".join(f"{s} steps" for s in steps) + " |",
             "|---|" + "---|" * len(steps)]
    for n in sorted({r["samples"] for r in rows}):
        by = {r["steps"]: r["accept_length"] for r in rows if r["samples"] == n}
        lines.append(f"| {n} | " + " | ".join(f"{by[s]:.2f}" if s in by else "-" for s in steps) + " |")
    (out / "data_scaling.md").write_text("Accept length on held-out prompts (greedy)\n\n" + "\n".join(lines) + "\n")
    plot(rows, out / "data_scaling.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
