"""`drafter prompts`: the target writes the user prompts that `drafter data` then has it answer.

No prompt data set is at hand offline, and none is needed: given its chat template up to the
user-turn header (drafter/user_turn.py), an aligned model writes a plausible user message
(Magpie). Varied system prompts and temperatures, each request seeded, give diverse prompts
in the target's own distribution of topics; drafter/prompt_filter.py drops junk and repeats.

Output JSONL, ready for `drafter data --prompts`:
  {"id": "self-17", "messages": [{"role": "system", ...}, {"role": "user", ...}]}  a chat prompt
  {"id": "self-18", "prompt": "The history of the printing press began"}          a raw prompt
  {"id": "mix-<id>", ...}                                                          from --mix
A share of the written prompts (`completion_share`) becomes a raw prompt, its opening words,
which `drafter data` continues WITHOUT the chat template: /v1/completions traffic then gets a
drafter trained on it too. Raw prompts in --mix act as a seed list of openings.

`<out>.rejected.jsonl` beside it keeps each dropped prompt and its reason. A rerun with the same
output appends until `num` prompts are written; request k always uses the same system prompt,
temperature and seed, and a rerun starts after the last request recorded in either file.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

from drafter.generate import Completion, GenerationFailed, GenParams, done_ids, make_backend, within
from drafter.prompt_filter import Deduplicator, FilterConfig, reject_reason
from drafter.prompts import Conversation, count_lines, read_prompts
from drafter.user_turn import end_of_turn_ids, template_markers, user_turn

SELF = "self-"   # id prefix of the prompts the target writes; "self-<request index>"

# "" leaves the template's default system prompt in place: what most chat users send.
SYSTEM_PROMPTS = (
    "",
    "You are a helpful assistant.",
    "You are an expert programmer. You help people write, debug, review and explain code.",
    "You are a patient math tutor who solves problems step by step.",
    "You are a creative writing assistant for stories, poems, essays, letters and editing.",
    "You are a science teacher who explains physics, chemistry, biology and astronomy clearly.",
    "You give practical everyday advice on cooking, travel, health, money and home life.",
    "You are a historian and humanities scholar who discusses history, philosophy and literature.",
    "You are a business and career coach.",
    "You extract, summarize, classify and reformat information precisely.",
    "You are a playful companion for role-play, games and riddles.",
)


@dataclass
class PromptsConfig:
    out: str
    num: int                          # prompts the target writes; --mix records come on top
    target: str | None = None         # generate in-process through the native engine
    endpoint: str | None = None       # or through an OpenAI-compatible endpoint (/completions)
    model: str | None = None
    api_key: str | None = None
    tokenizer: str | None = None      # default: the target directory
    system_prompts: list[str] = field(default_factory=lambda: list(SYSTEM_PROMPTS))
    temperatures: list[float] = field(default_factory=lambda: [0.8, 1.0, 1.2])
    top_p: float = 1.0
    seed: int = 0
    completion_share: float = 0.2     # share of written prompts that become raw openings
    opening_words: int = 16
    mix: str | None = None            # user prompt JSONL to add, deduplicated against the written ones
    filters: FilterConfig = field(default_factory=FilterConfig)   # its max_tokens caps generation
    concurrency: int = 64
    max_requests: int = 0             # per run; 0: 10 per prompt still missing
    device: str = "auto"
    dtype: str = "auto"
    max_batch: int = 16
    max_context: int = 0              # 0: the model's (the KV cache holds max_batch rows of it)
    time_limit_s: float = 0           # > 0: stop after this long (a rerun continues)


@dataclass
class _State:
    """What the output holds so far: its ids, its prompts (for dedup), the next request index."""
    chats: Deduplicator
    openings: Deduplicator
    ids: set[str] = field(default_factory=set)
    written: int = 0
    next_request: int = 0


def opening(text: str, max_words: int, min_words: int = 4) -> str:
    """The first sentence of `text` (at least `min_words` words, at most `max_words`): how a
    document starts, which is what a completion-style prompt is."""
    words: list[str] = []
    for w in text.split()[:max_words]:
        words.append(w)
        if len(words) >= min_words and w[-1] in ".!?:":
            break
    return " ".join(words)


def _first_user_message(conv: Conversation) -> str:
    return conv.first_prompt()[-1]["content"]


def _resume(out: Path, rejected: Path, near_duplicate: float) -> _State:
    st = _State(Deduplicator(near_duplicate), Deduplicator(near_duplicate))
    recorded = done_ids(out) | done_ids(rejected)   # also repairs a last line cut by a crash
    st.next_request = max((int(i[len(SELF):]) + 1 for i in recorded if i.startswith(SELF)), default=0)
    if out.exists():
        for conv in read_prompts(out):
            st.ids.add(conv.id)
            st.written += conv.id.startswith(SELF)
            if conv.raw_prompt is not None:
                st.openings.add(conv.raw_prompt)
            else:
                st.chats.add(_first_user_message(conv))
    return st


def _mix(path: str, f: TextIO, st: _State) -> dict:
    """Append the --mix records not in the output yet, minus repeats of prompts already there."""
    n = dup = 0
    for conv in read_prompts(path):
        rid = f"mix-{conv.id}"
        if rid in st.ids:
            continue
        if conv.raw_prompt is not None:
            rec, repeat = {"id": rid, "prompt": conv.raw_prompt}, st.openings.add(conv.raw_prompt)
        else:
            rec, repeat = {"id": rid, "messages": conv.messages}, st.chats.add(_first_user_message(conv))
        if repeat:
            dup += 1
            continue
        f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        st.ids.add(rid)
        n += 1
    f.flush()
    return {"mixed": n, "mix_duplicates": dup}


class _Writer:
    """Turns the target's completions of user-turn prefixes into filtered, deduplicated records."""

    def __init__(self, c: PromptsConfig, tok, st: _State, out: TextIO, rejected: TextIO):
        self.c, self.tok, self.st, self.out, self.rejected = c, tok, st, out, rejected
        turns = [user_turn(tok, s) for s in c.system_prompts]
        self.prefixes = [tok(t.prefix, add_special_tokens=False)["input_ids"] for t in turns]
        self.stops = end_of_turn_ids(tok, turns[0])
        self.markers = template_markers(tok, turns[0])
        self.reasons: Counter = Counter()
        self.kinds: Counter = Counter()

    def request(self, i: int) -> tuple[int, GenParams, bool]:
        """Request i: which system prompt, its sampling (seeded by i), and whether its prompt
        becomes a raw opening. Every system prompt meets every temperature."""
        c, n = self.c, len(self.c.system_prompts)
        rng = random.Random(f"{c.seed}:{i}")
        p = GenParams(max_tokens=c.filters.max_tokens, temperature=c.temperatures[i // n % len(c.temperatures)],
                      top_p=c.top_p, seed=rng.getrandbits(63), stop_token_ids=self.stops)
        return i % n, p, rng.random() < c.completion_share

    def _text(self, comp: Completion) -> str:
        """The written message with any special tokens in it visible, without its end-of-turn token."""
        if comp.token_ids is None:
            return comp.text.strip()
        ids = comp.token_ids[:-1] if comp.token_ids and comp.token_ids[-1] in self.stops else comp.token_ids
        return self.tok.decode(ids).strip()

    def _problem(self, text: str, comp: Completion) -> str | None:
        if comp.finish_reason != "stop":
            return "unfinished"   # cut at max_tokens: half a prompt
        n_tokens = len(self.tok(text, add_special_tokens=False)["input_ids"])
        return reject_reason(text, n_tokens, self.markers, self.c.filters)

    def reject(self, i: int, reason: str, text: str) -> None:
        self.reasons[reason] += 1
        self.rejected.write(json.dumps({"id": f"{SELF}{i}", "reason": reason, "text": text}, ensure_ascii=False) + "\n")
        self.rejected.flush()

    def _write(self, kind: str, rec: dict) -> None:
        self.kinds[kind] += 1
        self.out.write(json.dumps(rec, ensure_ascii=False) + "\n")
        self.out.flush()
        self.st.written += 1

    def take(self, i: int, system: int, comp: Completion, as_raw: bool) -> bool:
        """Write request i's prompt, or why it was dropped; True if written."""
        text = self._text(comp)
        reason = self._problem(text, comp)
        if reason is None and as_raw:
            head = opening(text, self.c.opening_words)
            if self.st.openings.add(head) is None:
                self._write("completion", {"id": f"{SELF}{i}", "prompt": head})
                return True
            # a repeated opening: the whole prompt may still be new as a chat prompt
        reason = reason or self.st.chats.add(text)
        if reason:
            self.reject(i, reason, text)
            return False
        sys_prompt = self.c.system_prompts[system]
        messages = [{"role": "system", "content": sys_prompt}] if sys_prompt else []
        self._write("chat", {"id": f"{SELF}{i}", "messages": messages + [{"role": "user", "content": text}]})
        return True


async def _write_prompts(c: PromptsConfig, w: _Writer) -> int:
    """Keep up to `concurrency` requests in flight, never more than the prompts still missing
    (none is thrown away at the end), until `num` are written or the request budget is spent."""
    st, budget = w.st, c.max_requests or 10 * (c.num - w.st.written)
    backend = make_backend(endpoint=c.endpoint, model=c.model, api_key=c.api_key, target=c.target,
                           concurrency=c.concurrency, device=c.device, dtype=c.dtype, max_batch=c.max_batch,
                           max_context=c.max_context)
    await backend.start()
    bar = tqdm(total=c.num, initial=st.written, desc="prompts", unit="prompt")
    requests = in_flight = 0

    async def worker():
        nonlocal requests, in_flight
        while st.written + in_flight < c.num and requests < budget:
            i, requests, in_flight = st.next_request, requests + 1, in_flight + 1
            st.next_request += 1
            system, p, as_raw = w.request(i)
            try:
                comp = await backend.complete_raw(w.prefixes[system], p)
            except GenerationFailed as e:
                w.reject(i, "failed", str(e))
                continue
            finally:
                in_flight -= 1
            if w.take(i, system, comp, as_raw):
                bar.update(1)
            bar.set_postfix(dropped=sum(w.reasons.values()), refresh=False)

    try:
        await within(c.time_limit_s, asyncio.gather(*(worker() for _ in range(c.concurrency))))
    finally:
        bar.close()
        await backend.close()
    return requests


def run_prompts(c: PromptsConfig) -> dict:
    from models.tokenizer import load_tokenizer
    tok_path = c.tokenizer or c.target
    if not tok_path:
        raise ValueError("--tokenizer DIR is needed with --endpoint (the target's chat template)")
    tok = load_tokenizer(tok_path)
    out = Path(c.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rejected_path = out.with_name(out.stem + ".rejected.jsonl")
    st = _resume(out, rejected_path, c.filters.near_duplicate)
    with open(out, "a", encoding="utf-8") as f, open(rejected_path, "a", encoding="utf-8") as fr:
        stats = _mix(c.mix, f, st) if c.mix else {}
        w = _Writer(c, tok, st, f, fr)
        t0 = time.monotonic()
        requests = asyncio.run(_write_prompts(c, w)) if st.written < c.num else 0
        seconds = time.monotonic() - t0
    # this run: requests, chat and completion records written, drops by reason; then the file's totals
    return {**stats, "requests": requests, "chat": w.kinds["chat"], "completion": w.kinds["completion"],
            "rejected": dict(w.reasons), "written_total": st.written, "records": count_lines(out),
            "seconds": round(seconds, 1), "requests_per_s": round(requests / max(seconds, 1e-9), 1)}
