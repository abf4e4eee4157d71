"""The tree speaks of the project as it is: development history lives in git, not in files.

Every tracked text file (code, comments, docs, profiles, tests, results) and every tracked path is
checked for the marks of a lab notebook: a development round named or counted, an issue's number,
names tagged with a round (an underscore, "s" and a number; "run" and a number), references to a
design brief the repository does not hold (its name and a section sign), and talk of aims (the
patterns below). Data sets (prompts, tokenizers, weights) are not prose and are skipped.

    python -m tests.test_no_history    # lists every offending line
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Text that is data, not the project's own words: prompt sets, tokenizers, weights, lock files.
DATA_SUFFIXES = {".jsonl", ".gz", ".safetensors", ".gguf", ".png", ".bin", ".pt"}
DATA_NAMES = {"tokenizer.json", "tokenizer_config.json"}

TEXT_MARKS = {
    # the word, not an identifier (`aiohttp.ClientSession`, `session.get(...)`, scope="session")
    "a development session": re.compile(r"(?<![\"'._])\bsessions?\b(?![\"'._(])", re.IGNORECASE),
    "an issue number": re.compile(r"\bissues? ?#?\d+", re.IGNORECASE),
    "a round-tagged name": re.compile(r"[A-Za-z0-9]_s\d{1,2}(?!\d)|/s\d{1,2}/|\b(?:run|round|turn)_?\d+\b"),
    "a development round": re.compile(r"\b(?:this|next|previous|earlier) (?:round|turn)\b",
                                      re.IGNORECASE),
    "a design brief outside the repository": re.compile(r"DESIGN(?:\.md)? ?§"),
    "aims talk": re.compile(r"\baimed at\b", re.IGNORECASE),
}
PATH_MARK = re.compile(r"(?:_s\d{1,2}|[/_-](?:run|round)\d+)(?:[/_.-]|$)")


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / p for p in out.decode().split("\0") if p]


def is_prose(path: Path) -> bool:
    if path.suffix in DATA_SUFFIXES or path.name in DATA_NAMES or path.name == Path(__file__).name:
        return False
    try:
        head = path.read_bytes()[:4096]
    except OSError:  # tracked but deleted in the work tree
        return False
    return b"\0" not in head


def offences() -> list[str]:
    found = []
    for path in tracked_files():
        rel = path.relative_to(ROOT).as_posix()
        if PATH_MARK.search(rel):
            found.append(f"{rel}: a round-tagged path")
        if not is_prose(path):
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for what, mark in TEXT_MARKS.items():
                if mark.search(line):
                    found.append(f"{rel}:{n}: {what}: {line.strip()[:120]}")
    return found


def test_the_tree_holds_no_development_history():
    found = offences()
    assert not found, f"{len(found)} lines tell history (python -m tests.test_no_history):\n" + \
        "\n".join(found[:40])


if __name__ == "__main__":
    print("\n".join(offences()))
