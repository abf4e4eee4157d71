"""Tokenized conversations in safetensors shards: the training set, cheap to write and read.

Each shard holds `input_ids` (int32) and `loss_mask` (uint8, 1 on assistant tokens, or on a
raw prompt's completion) of many conversations back to back, and `offsets` (int64 [n + 1]).
Training reads single conversations as lazy slices of the memory-mapped files, so data sets
far larger than RAM work. Shard k holds lines [k * S, (k + 1) * S) of `generated.jsonl`, which
only grows, so a rerun rewrites only the last, partial shard and any new ones.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from drafter.prompts import raw_prompt_ids

SHARD_DIR = "shards"


def assistant_spans(tok, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant turns (content and
    end-of-turn marker, without the template's trailing whitespace)."""
    text = tok.apply_chat_template(messages, tokenize=False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prefix = tok.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        upto = tok.apply_chat_template(messages[:i + 1], tokenize=False)
        if not text.startswith(prefix) or not text.startswith(upto):
            raise ValueError("the chat template does not render conversations prefix by prefix; "
                             "cannot locate assistant turns")
        end = len(prefix) + len(upto[len(prefix):].rstrip())
        spans.append((len(prefix), end))
    return text, spans


def _plan(tok, messages: list[dict], completion_ids: list | None) -> list[tuple[str, object, int]]:
    """The conversation as pieces (kind, value, mask): ("text", str, m) to tokenize, ("ids",
    [int], m) for a completion's exact ids; without exact ids a single ("offsets", (text,
    spans), 0) piece: the whole text, masked by character spans after tokenizing."""
    text, spans = assistant_spans(tok, messages)
    if not completion_ids:
        return [("offsets", (text, spans), 0)]
    turns = [m["content"] for m in messages if m["role"] == "assistant"]
    special = set(tok.all_special_ids)
    pieces, pos = [], 0
    for (start, end), content, ids in zip(spans, turns, completion_ids):
        if ids is None or text[start:start + len(content)] != content:
            return [("offsets", (text, spans), 0)]
        ids = list(ids)
        while ids and ids[-1] in special:   # a generated stop token: the template writes the end marker
            ids.pop()
        pieces += [("text", text[pos:start], 0), ("ids", list(ids), 1), ("text", text[start + len(content):end], 1)]
        pos = end
    pieces.append(("text", text[pos:], 0))
    return pieces


def _raw_plan(tok, rec: dict) -> list[tuple[str, object, int]]:
    """A completion-style record as the target saw it: the prompt's ids as /v1/completions makes
    them (mask 0), then what it generated (mask 1): the exact ids with their stop token, or else
    the completion's text."""
    ids = (rec.get("completion_ids") or [None])[0]
    completion = ("ids", list(ids), 1) if ids is not None else ("text", rec["completion"], 1)
    return [("ids", raw_prompt_ids(tok, rec["prompt"]), 0), completion]


def tokenize_batch(tok, records: list[dict]) -> list[tuple[list[int], list[int]]]:
    """(input_ids, loss_mask) per record; mask 1 on assistant tokens (content and end-of-turn
    marker), or on a raw prompt's completion. Exact completion ids are used where the record has
    them; otherwise the rendered text is tokenized whole and tokens starting inside an assistant
    span are masked."""
    plans = [_plan(tok, r["messages"], r.get("completion_ids")) if "messages" in r else _raw_plan(tok, r)
             for r in records]
    texts = [v[0] if k == "offsets" else v for p in plans for k, v, _ in p if k in ("text", "offsets")]
    enc = tok(texts, add_special_tokens=False, return_offsets_mapping=True) if texts else {"input_ids": []}
    it = iter(zip(enc["input_ids"], enc.get("offset_mapping", [])))
    out = []
    for plan in plans:
        ids, mask = [], []
        for kind, value, m in plan:
            if kind == "ids":
                ids += value
                mask += [m] * len(value)
                continue
            piece_ids, offs = next(it)
            ids += piece_ids
            if kind == "offsets":
                spans = value[1]
                mask += [int(e > s and any(a <= s < b for a, b in spans)) for s, e in offs]
            else:
                mask += [m] * len(piece_ids)
        out.append((ids, mask))
    return out


@dataclass
class ShardInfo:
    file: str
    records: int
    tokens: int
    loss_tokens: int


def _write_shard(path: Path, samples: list[tuple[list[int], list[int]]], meta: dict) -> ShardInfo:
    ids = torch.tensor([t for s in samples for t in s[0]], dtype=torch.int32)
    mask = torch.tensor([t for s in samples for t in s[1]], dtype=torch.uint8)
    offsets = torch.zeros(len(samples) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor([len(s[0]) for s in samples], dtype=torch.int64).cumsum(0)
    tmp = path.with_suffix(".tmp")
    save_file({"input_ids": ids, "loss_mask": mask, "offsets": offsets}, str(tmp),
              metadata={k: str(v) for k, v in meta.items()})
    os.replace(tmp, path)
    return ShardInfo(path.name, len(samples), ids.numel(), int(mask.sum()))


def _shard_meta(path: Path) -> dict | None:
    try:
        with safe_open(str(path), "pt") as f:
            return f.metadata() or {}
    except Exception:  # noqa: BLE001 - unreadable: rewrite it
        return None


def _read_info(path: Path) -> ShardInfo:
    with safe_open(str(path), "pt") as f:
        n = f.get_slice("offsets").get_shape()[0] - 1
        mask = f.get_tensor("loss_mask")
        return ShardInfo(path.name, n, mask.numel(), int(mask.sum()))


def _chunks(path: Path, size: int) -> Iterator[list[str]]:
    chunk = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                chunk.append(line)
                if len(chunk) == size:
                    yield chunk
                    chunk = []
    if chunk:
        yield chunk


def write_shards(generated: Path, tok, out_dir: Path, shard_size: int = 10000, batch: int = 256) -> list[ShardInfo]:
    """Tokenize `generated` into shards under out_dir/shards; keep shards already complete."""
    sdir = out_dir / SHARD_DIR
    sdir.mkdir(parents=True, exist_ok=True)
    template = hashlib.sha1((tok.chat_template or "").encode()).hexdigest()[:12]
    tokenizer_id = f"{Path(getattr(tok, 'name_or_path', '') or '.').name}|{len(tok)}|{template}"
    infos = []
    with open(generated, encoding="utf-8") as f:
        n_lines = sum(1 for line in f if line.strip())
    bar = tqdm(total=n_lines, desc="tokenize", unit="conv")
    for k, lines in enumerate(_chunks(generated, shard_size)):
        path = sdir / f"shard-{k:05d}.safetensors"
        meta = {"records": len(lines), "shard_size": shard_size, "first_line": k * shard_size,
                "tokenizer": tokenizer_id}
        old = _shard_meta(path) if path.exists() else None
        if old == {k2: str(v) for k2, v in meta.items()}:
            infos.append(_read_info(path))
            bar.update(len(lines))
            continue
        samples = []
        for i in range(0, len(lines), batch):
            convs = [json.loads(line) for line in lines[i:i + batch]]
            samples += tokenize_batch(tok, convs)
            bar.update(len(convs))
        infos.append(_write_shard(path, samples, meta))
    bar.close()
    for stale in sorted(sdir.glob("shard-*.safetensors"))[len(infos):]:
        stale.unlink()
    index = {"shards": [vars(i) for i in infos], "records": sum(i.records for i in infos),
             "tokens": sum(i.tokens for i in infos), "loss_tokens": sum(i.loss_tokens for i in infos),
             "vocab_size": len(tok), "tokenizer": tokenizer_id}
    (out_dir / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    return infos


class TokenShards:
    """Random access to conversations across shards, read lazily from memory-mapped files."""

    def __init__(self, data_dir: str | Path, min_tokens: int = 3):
        files = sorted((Path(data_dir) / SHARD_DIR).glob("shard-*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{Path(data_dir) / SHARD_DIR}: no shards (run `drafter data` first)")
        self.files = files
        self.handles = [safe_open(str(f), "pt") for f in files]
        self.offsets = [h.get_tensor("offsets") for h in self.handles]
        self.index = [(s, i) for s, off in enumerate(self.offsets)
                      for i in range(off.numel() - 1) if off[i + 1] - off[i] >= min_tokens]

    def __len__(self) -> int:
        return len(self.index)

    def length(self, j: int) -> int:
        """Tokens of conversation j, from the offsets alone (nothing read)."""
        s, i = self.index[j]
        return int(self.offsets[s][i + 1] - self.offsets[s][i])

    def __getitem__(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        s, i = self.index[j]
        a, b = int(self.offsets[s][i]), int(self.offsets[s][i + 1])
        h = self.handles[s]
        return h.get_slice("input_ids")[a:b].long(), h.get_slice("loss_mask")[a:b].bool()

    def whole_shards(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for h in self.handles:
            yield h.get_tensor("input_ids"), h.get_tensor("loss_mask")
