"""docs/ stays true to the code: the flag reference is the one the generator makes now, every
link points at a file or heading that exists, every built-in profile and every `drafter` command
is documented, and the pages read as the project is today (no development history).

    python -m launch.flag_reference --write docs/serving.md   # after changing a flag or a profile key
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from launch.flag_reference import BEGIN, END, NOTES, profile_keys, reference, unflagged_keys
from launch.profiles import available_profiles
from tests.test_no_history import TEXT_MARKS

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
MAX_LINES = 330
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}


def test_the_pages_exist():
    names = {p.name for p in PAGES}
    assert {"architecture.md", "speculative-decoding.md", "serving.md", "api.md", "drafter.md",
            "performance.md"} <= names


def test_the_flag_reference_is_current():
    text = (DOCS / "serving.md").read_text()
    start, end = text.find(BEGIN), text.find(END)
    assert start >= 0 and end > start, "docs/serving.md lost its generated block's markers"
    assert text[start:end + len(END)] + "\n" == reference(), \
        "docs/serving.md's flag reference is stale: python -m launch.flag_reference --write docs/serving.md"


def test_every_profile_key_without_a_flag_is_described():
    keys = profile_keys()
    bare = [k for k in unflagged_keys() if not (keys[k].description or NOTES.get(k))]
    assert not bare, f"describe these in the schema or in launch/flag_reference.NOTES: {bare}"
    assert set(NOTES) <= set(keys), f"NOTES for keys that do not exist: {sorted(set(NOTES) - set(keys))}"


def test_every_builtin_profile_is_in_the_profile_table():
    text = (DOCS / "serving.md").read_text()
    missing = [name for name in available_profiles() if f"| `{name}` |" not in text]
    assert not missing, f"docs/serving.md's profile table lacks {missing}"


def test_every_drafter_command_is_documented():
    from drafter.cli import parser

    sub = next(a for a in parser()._actions if a.dest == "cmd")
    text = (DOCS / "drafter.md").read_text()
    missing = [cmd for cmd in sub.choices if f"drafter {cmd}" not in text]
    assert not missing, f"docs/drafter.md does not show {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_lead_somewhere(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_are_short_and_tell_no_history(page):
    lines = page.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"{page.name} has {len(lines)} lines: split it"
    found = [f"{page.name}:{n}: {what}" for n, line in enumerate(lines, 1)
             for what, mark in TEXT_MARKS.items() if mark.search(line)]
    assert not found, found
