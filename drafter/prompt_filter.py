"""Quality filters and deduplication for prompts the target writes itself.

A small model sampled at temperature 1.2 writes some junk: half a template, a word repeated
to the length limit, bytes that are not text, or the same popular question again and again.
Each of those would cost a regeneration and teach the drafter nothing, so every prompt gets a
reason to be dropped or none (`reject_reason`), and a `Deduplicator` drops exact repeats
(hash of the normalized text) and near repeats (MinHash LSH).

MinHash LSH comes from `datasketch`, the library text-dedup pipelines use for this: it
picks the band/row split for a Jaccard threshold, hashes shingles vectorized with numpy,
and its index answers "is anything already here similar?" in constant time per prompt, so
dedup stays linear in the number of prompts instead of comparing all pairs.
"""
from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass

_WORD = re.compile(r"\w+")


@dataclass
class FilterConfig:
    min_chars: int = 12
    max_chars: int = 4000
    min_tokens: int = 4
    max_tokens: int = 512
    max_repeat_ratio: float = 0.3     # repeated word 3-grams / all word 3-grams
    min_alpha_ratio: float = 0.25     # letters / non-space characters
    near_duplicate: float = 0.7       # Jaccard similarity of character 5-grams


def repeat_ratio(text: str, n: int = 3) -> float:
    """Share of word n-grams that repeat an earlier one: 0 for fresh text, near 1 for a loop."""
    words = _WORD.findall(text.lower())
    grams = list(zip(*(words[i:] for i in range(n))))
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def _non_text(text: str, min_alpha_ratio: float) -> bool:
    if "\ufffd" in text or any(unicodedata.category(ch) == "Cc" and ch not in "\n\t\r" for ch in text):
        return True   # a cut UTF-8 sequence or control bytes
    visible = [ch for ch in text if not ch.isspace()]
    return sum(ch.isalpha() for ch in visible) < min_alpha_ratio * len(visible)


def reject_reason(text: str, n_tokens: int, markers: list[str], c: FilterConfig) -> str | None:
    """Why `text` is not a usable prompt, or None. `markers`: strings that only a template
    writes (special tokens, the placeholder): seeing one means the model left the user turn."""
    if not text.strip():
        return "empty"
    if any(m in text for m in markers):
        return "template_marker"
    if not any(ch.isalpha() for ch in text):
        return "no_letters"
    if _non_text(text, c.min_alpha_ratio):
        return "non_text"
    if len(text) < c.min_chars or n_tokens < c.min_tokens:
        return "too_short"
    if len(text) > c.max_chars or n_tokens > c.max_tokens:
        return "too_long"
    if repeat_ratio(text) > c.max_repeat_ratio:
        return "repetitive"
    return None


def normalize(text: str) -> str:
    """Lowercase words only: case, punctuation and spacing do not make a prompt new."""
    return " ".join(_WORD.findall(text.lower()))


class Deduplicator:
    """Remembers the prompts kept so far; `add` says whether a new one repeats one of them."""

    def __init__(self, near_duplicate: float = 0.7, num_perm: int = 128, shingle: int = 5):
        from datasketch import MinHashLSH
        self.exact: set[bytes] = set()
        self.lsh = MinHashLSH(threshold=near_duplicate, num_perm=num_perm)
        self.num_perm, self.shingle = num_perm, shingle

    def _minhash(self, norm: str):
        from datasketch import MinHash
        m = MinHash(num_perm=self.num_perm)
        k = self.shingle
        m.update_batch(norm[i:i + k].encode() for i in range(max(1, len(norm) - k + 1)))
        return m

    def add(self, text: str) -> str | None:
        """Insert `text` unless it repeats a kept prompt; returns "duplicate", "near_duplicate" or None."""
        norm = normalize(text)
        digest = hashlib.sha1(norm.encode()).digest()
        if digest in self.exact:
            return "duplicate"
        m = self._minhash(norm)
        if self.lsh.query(m):
            return "near_duplicate"
        self.exact.add(digest)
        self.lsh.insert(digest.hex(), m)
        return None
