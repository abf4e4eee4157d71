"""Read prompt files: ShareGPT JSONL (`{"conversations": [{"from": "human", "value": ...}]}`),
JSONL of chat messages (`{"messages": [{"role": "user", "content": ...}]}`), or raw text prompts
(`{"prompt": "..."}`: what /v1/completions users send, continued without the chat template),
streamed line by line so a million-line file costs no memory."""
from __future__ import annotations

import dataclasses
import heapq
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system"}


@dataclass
class Conversation:
    id: str
    messages: list[dict]   # {"role": system|user|assistant, "content": str}
    raw_prompt: str | None = None   # a completion-style prompt (then `messages` is empty)
    category: str | None = None     # a record's "category" (held-out sets: MT-bench's, for per-category results)

    @property
    def user_turns(self) -> int:
        return sum(m["role"] == "user" for m in self.messages)

    def without_system(self) -> "Conversation":
        return dataclasses.replace(self, messages=[m for m in self.messages if m["role"] != "system"])

    def first_prompt(self) -> list[dict]:
        """The messages up to and including the first user turn (what eval sends)."""
        for i, m in enumerate(self.messages):
            if m["role"] == "user":
                return self.messages[:i + 1]
        return []


def parse_record(rec: dict, fallback_id: str) -> Conversation:
    category = rec.get("category")
    if category is not None and not isinstance(category, str):
        raise ValueError(f"a category must be a string, got {type(category).__name__}")
    if "prompt" in rec and "conversations" not in rec and "messages" not in rec:
        if not isinstance(rec["prompt"], str):
            raise ValueError(f"a raw prompt must be a string, got {type(rec['prompt']).__name__}")
        return Conversation(id=str(rec.get("id", fallback_id)), messages=[], raw_prompt=rec["prompt"],
                            category=category)
    if "conversations" in rec:
        raw = [(t.get("from") or t.get("role"), t.get("value", t.get("content"))) for t in rec["conversations"]]
    elif "messages" in rec:
        raw = [(m.get("role") or m.get("from"), m.get("content", m.get("value"))) for m in rec["messages"]]
    else:
        raise ValueError("expected a 'conversations' (ShareGPT) or 'messages' list, or a 'prompt' string")
    msgs = []
    for role, content in raw:
        r = ROLES.get(str(role).lower())
        if r is None:
            raise ValueError(f"unknown role {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"message content must be a string, got {type(content).__name__}")
        if r == "assistant" and not any(m["role"] == "user" for m in msgs):
            continue  # an assistant turn before any user turn has no prompt
        msgs.append({"role": r, "content": content})
    return Conversation(id=str(rec.get("id", fallback_id)), messages=msgs, category=category)


def read_prompts(path: str | Path, limit: int = 0) -> Iterator[Conversation]:
    """Conversations with at least one user turn, and non-empty raw prompts; ids default to the
    0-based line number."""
    n = 0
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f):
            line = line.strip()
            if not line:
                continue
            try:
                conv = parse_record(json.loads(line), str(lineno))
            except (json.JSONDecodeError, ValueError, AttributeError) as e:
                raise ValueError(f"{path}:{lineno + 1}: {e}") from None
            if conv.user_turns == 0 and not conv.raw_prompt:
                continue
            yield conv
            n += 1
            if limit and n >= limit:
                return


def read_prompt_files(paths: list[str | Path], limit: int = 0) -> Iterator[Conversation]:
    """Several prompt files as one stream, interleaved in proportion to their sizes (file i's
    j-th record sits at (j + 1/2) / n_i), so any prefix (a run cut by its time limit, a
    `--limit-samples` of the data) holds the same mix. Record ids must be unique across files."""
    if len(paths) == 1:
        yield from read_prompts(paths[0], limit)
        return
    sizes = [max(1, count_lines(p)) for p in paths]

    def placed(i: int):
        return (((j + 0.5) / sizes[i], i, conv) for j, conv in enumerate(read_prompts(paths[i])))

    seen: set[str] = set()
    merged = heapq.merge(*[placed(i) for i in range(len(paths))], key=lambda x: x[:2])
    for k, (_, i, conv) in enumerate(merged):
        if limit and k >= limit:
            return
        if conv.id in seen:
            raise ValueError(f"{paths[i]}: record id {conv.id!r} is also in another prompt file; ids must be unique")
        seen.add(conv.id)
        yield conv


def raw_prompt_ids(tok, text: str) -> list[int]:
    """A raw prompt's token ids as /v1/completions makes them (server/prompts.py): with the
    tokenizer's own special tokens, i.e. BOS only where the model adds one (SmolLM2 does not:
    its `tokenizer.ggml.add_bos_token` is false)."""
    return list(tok.encode(text, add_special_tokens=True))


def read_records(path: str | Path) -> list[dict]:
    """A JSON-lines file's records, as they are. By file line, not str.splitlines: a text written
    with ensure_ascii=False may hold U+2028, where splitlines splits."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def count_lines(path: str | Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())
