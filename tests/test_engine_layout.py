"""The engine's shape, read from its source: small files, and no code that exists for a benchmark.

Benchmarks build engines with the kernel plan and acceptance they want and observe through the
engine's public interface (benchmarks/engine_load.py); engine/ and models/ name nothing of theirs.
"""
from __future__ import annotations

import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_ENGINE_FILE_LINES = 400
BENCHMARK_WORDS = ("benchmark", "synthetic")   # in an identifier: a benchmark's hook or switch


def test_no_engine_file_is_over_400_lines():
    long = {p.name: n for p in sorted((ROOT / "engine").glob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_ENGINE_FILE_LINES}
    assert not long, f"engine files over {MAX_ENGINE_FILE_LINES} lines: {long}"


def test_engine_and_models_name_no_benchmark_hook():
    """No identifier (function, attribute, variable, argument) in engine/ or models/ names a
    benchmark or synthetic acceptance; comments and strings may mention them."""
    found = []
    for package in ("engine", "models"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
                if tok.type == tokenize.NAME and any(w in tok.string.lower() for w in BENCHMARK_WORDS):
                    found.append(f"{path.relative_to(ROOT)}:{tok.start[0]} {tok.string}")
    assert not found, found


def test_the_check_finds_a_benchmark_hook(tmp_path):
    """The tokenizer sees identifiers, not the words of comments or strings."""
    src = 'x = {"benchmark_fusion": True}  # benchmarks time it\nuse_synthetic_acceptance = False\n'
    names = [t.string for t in tokenize.generate_tokens(io.StringIO(src).readline) if t.type == tokenize.NAME]
    assert [n for n in names if any(w in n.lower() for w in BENCHMARK_WORDS)] == ["use_synthetic_acceptance"]
