"""Incremental detokenization and stop-string handling for one request.

Text is produced by decoding a small window of recent tokens (as vLLM does), so a
multi-byte character split across tokens is held back until complete. Text that could
still become the start of a stop string is held back too, so a stream never shows part of
a stop string; on a match the text ends just before it.
"""
from __future__ import annotations


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int], stop: list[str], skip_special_tokens: bool = True):
        self.tok = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(prompt_ids[-6:])    # context so the first word gets its leading space right
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.prefix_text: str | None = None  # decode of ids[prefix_offset:read_offset], cached
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""          # all output text so far
        self.emitted = 0        # characters of self.text already returned
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> None:
        """Append one token; sets `stopped` when a stop string appears."""
        self.ids.append(token_id)
        if self.prefix_text is None:
            self.prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        prefix = self.prefix_text
        full = self._decode(self.ids[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            new = full[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            self.prefix_text = None
            before = len(self.text)
            self.text += new
            self._check_stop(before)

    def _check_stop(self, before: int) -> None:
        start = max(0, before - self.hold)
        hits = [i for s in self.stop if (i := self.text.find(s, start)) >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            self.stopped = True

    def take(self, final: bool = False) -> str:
        """Text not yet returned; keeps back a possible stop-string prefix unless final."""
        end = len(self.text) if (final or self.stopped) else max(self.emitted, len(self.text) - self.hold)
        out = self.text[self.emitted:end]
        self.emitted = end
        return out
