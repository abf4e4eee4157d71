"""Structured outputs: compile a request's Constraint with xgrammar (SGLang's and vLLM's default
backend), off the engine loop and within a time limit.

Compilation runs in a worker thread (xgrammar releases the GIL while it compiles), so the
engine keeps stepping other requests meanwhile; the scheduler refuses a request whose grammar
fails to compile (a 400 with xgrammar's message) or is not ready after `timeout_s`, so a
pathological schema cannot hold a request slot or the engine. Compiled grammars are cached by
xgrammar (the same schema twice compiles once).

JSON is compact (", " and ": " separators, no free whitespace, as vLLM's disable_any_whitespace):
with free whitespace small models often emit blank lines until max_tokens. json_schema is
strict (unlisted properties are refused unless the schema allows them). xgrammar's JSON
strings admit raw control characters (U+0000-U+001F), which JSON forbids and strict parsers
refuse: for JSON constraints every token holding such a byte is masked too (`control_tokens`).
"""
from __future__ import annotations

import concurrent.futures
import json
import re

import torch

from engine.api import Constraint

COMPILE_THREADS = 2  # one pathological schema still leaves a thread for the others
# xgrammar prefixes C++ errors with "[hh:mm:ss] /path/file.cc:123: "; the client needs the rest.
_CPP_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


class GrammarError(ValueError):
    """A constraint that does not compile; the message is xgrammar's."""


class Grammars:
    """The compiler for one tokenizer and vocabulary (the target's logits width)."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: list[int]):
        import xgrammar as xgr
        self._xgr = xgr
        self.vocab_size = vocab_size
        self.stop_ids = sorted(stop_ids)
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=self.stop_ids)
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)
        control = [i for i, b in enumerate(info.decoded_vocab) if any(c < 0x20 for c in b) and i not in stop_ids]
        self.control_tokens = torch.tensor(control, dtype=torch.long)
        self.pool = concurrent.futures.ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="grammar")

    def submit(self, c: Constraint) -> concurrent.futures.Future:
        """Compile in the worker thread; the future holds the compiled grammar or a GrammarError."""
        return self.pool.submit(self.compile, c)

    def compile(self, c: Constraint):
        try:
            if c.kind == "json_object":
                return self.compiler.compile_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
            if c.kind == "json_schema":
                return self.compiler.compile_json_schema(c.spec, any_whitespace=False, strict_mode=True)
            if c.kind == "regex":
                return self.compiler.compile_regex(c.spec)
            if c.kind == "choice":
                return self.compiler.compile_grammar("root ::= " + " | ".join(json.dumps(s) for s in c.spec))
            if c.kind == "grammar":
                return self.compiler.compile_grammar(c.spec)
        except Exception as e:  # RuntimeError / ValueError from the C++ side, with its message
            raise GrammarError(f"{c.field}: {_CPP_PREFIX.sub('', str(e)).strip()}") from None
        raise GrammarError(f"{c.field}: unknown constraint kind {c.kind!r}")

    def matcher(self, compiled):
        return self._xgr.GrammarMatcher(compiled, override_stop_tokens=self.stop_ids)

    def bitmask(self, rows: int) -> torch.Tensor:
        return self._xgr.allocate_token_bitmask(rows, self.vocab_size)

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        """Set the logits [N, V] (float32, CPU or CUDA) of disallowed tokens to -inf, in place."""
        self._xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True))

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def allowed(bitmask_row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """One bitmask row (int32 words, bit j of word w = token 32 w + j) as a bool tensor [V]."""
    bits = (bitmask_row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:vocab_size].bool()
