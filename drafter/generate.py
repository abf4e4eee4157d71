"""Regenerate assistant turns with the target: through any OpenAI-compatible endpoint or
in-process through the native engine, with bounded concurrency, retries and resume.

Why regenerate: the drafter must predict what *this target* says, so training responses come
from the target itself (greedy by default), not from the data set's original model.
Output: `generated.jsonl`, one finished conversation per line, appended as requests finish;
a rerun skips the ids already there.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Protocol

from tqdm import tqdm

from drafter.prompts import Conversation, raw_prompt_ids


@dataclass
class GenParams:
    max_tokens: int = 2048
    raw_max_tokens: int = 256   # for raw prompts: a continuation has no end of turn and often runs to its cap
    temperature: float = 0.0
    top_p: float = 1.0
    max_turns: int = 0          # regenerate at most this many user turns per conversation (0: all)
    seed: int | None = None     # per-request sampling seed (reproducible prompts at temperature > 0)
    stop_token_ids: list[int] = field(default_factory=list)   # end-of-turn ids besides the model's EOS


@dataclass
class Completion:
    text: str
    finish_reason: str | None
    token_ids: list[int] | None = None   # the exact generated ids, when the backend knows them
    usage_tokens: int = 0                # the response's usage.completion_tokens, when it sent no ids

    @property
    def tokens(self) -> int:
        """How many tokens it generated."""
        return len(self.token_ids) if self.token_ids is not None else self.usage_tokens


class GenerationFailed(RuntimeError):
    """A request failed for good (non-retryable status, or retries exhausted)."""


class Backend(Protocol):
    async def start(self) -> None: ...
    async def complete(self, messages: list[dict], p: GenParams) -> Completion: ...
    async def complete_raw(self, prompt: str | list[int], p: GenParams) -> Completion: ...
    async def close(self) -> None: ...


class EndpointBackend:
    """POST {endpoint}/chat/completions (/completions for raw prompts); retries timeouts,
    connection errors, 408/409/429/5xx with exponential backoff and jitter (honouring
    Retry-After). A choice carrying `token_ids` (vLLM's `return_token_ids` extension) gives
    exact ids; otherwise the text is re-tokenized later."""

    def __init__(self, endpoint: str, model: str, api_key: str | None = None, *, concurrency: int = 64,
                 timeout_s: float = 600.0, retries: int = 5, backoff_s: float = 1.0, max_backoff_s: float = 60.0,
                 request_token_ids: bool = False, transport=None):
        self.endpoint, self.model, self.api_key = endpoint.rstrip("/"), model, api_key
        self.concurrency, self.timeout_s = concurrency, timeout_s
        self.retries, self.backoff_s, self.max_backoff_s = retries, backoff_s, max_backoff_s
        self.request_token_ids = request_token_ids
        self.transport = transport   # tests pass an httpx.MockTransport
        self.client = None

    async def start(self) -> None:
        import httpx
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self.client = httpx.AsyncClient(base_url=self.endpoint, headers=headers, timeout=self.timeout_s,
                                        limits=httpx.Limits(max_connections=self.concurrency),
                                        transport=self.transport)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    def _body(self, p: GenParams) -> dict:
        body = {"model": self.model, "max_tokens": p.max_tokens, "temperature": p.temperature, "top_p": p.top_p,
                "stream": False}
        if p.seed is not None:
            body["seed"] = p.seed
        if p.stop_token_ids:
            body["stop_token_ids"] = list(p.stop_token_ids)
        if self.request_token_ids:
            body["return_token_ids"] = True   # vLLM's extension; the ids come back in choices[0].token_ids
        return body

    async def complete(self, messages: list[dict], p: GenParams) -> Completion:
        return await self._post("/chat/completions", {**self._body(p), "messages": messages},
                                lambda choice: choice["message"].get("content") or "")

    async def complete_raw(self, prompt: str | list[int], p: GenParams) -> Completion:
        """Continue `prompt` (text, or token ids as OpenAI's API takes them) without the chat template."""
        return await self._post("/completions", {**self._body(p), "prompt": prompt}, lambda choice: choice["text"])

    async def _post(self, path: str, body: dict, text: Callable[[dict], str]) -> Completion:
        import httpx
        error = ""
        for attempt in range(self.retries + 1):
            wait = None
            try:
                r = await self.client.post(path, json=body)
                if r.status_code == 200:
                    data = r.json()
                    choice, usage = data["choices"][0], data.get("usage") or {}
                    ids = choice.get("token_ids")
                    return Completion(text(choice), choice.get("finish_reason"), ids if isinstance(ids, list) else None,
                                      int(usage.get("completion_tokens") or 0))
                error = f"HTTP {r.status_code}: {r.text[:300]}"
                if r.status_code not in (408, 409, 429) and r.status_code < 500:
                    raise GenerationFailed(error)
                if r.headers.get("retry-after", "").isdigit():
                    wait = float(r.headers["retry-after"])
            except (httpx.TransportError, json.JSONDecodeError, KeyError, IndexError) as e:
                error = f"{type(e).__name__}: {e}"
            if attempt < self.retries:
                backoff = min(self.max_backoff_s, self.backoff_s * 2 ** attempt) * (0.5 + random.random() / 2)
                await asyncio.sleep(max(backoff, wait or 0.0))
        raise GenerationFailed(f"gave up after {self.retries + 1} attempts: {error}")


class NativeBackend:
    """The target in this process through our NativeEngine, tuned for throughput: many requests
    prefill together, admission waits for an eighth of the rows to be free, and requests ask
    for token ids only (no incremental detokenization; the text is decoded once at the end)."""

    def __init__(self, target: str, *, device: str = "auto", dtype: str = "auto", max_batch: int = 16,
                 max_context: int = 0):
        from engine.loading import NativeEngineArgs, build_engine
        self.engine = build_engine(NativeEngineArgs(
            model=target, device=device, dtype=dtype, max_batch=max_batch, max_context=max_context,
            max_waiting=1 << 30, prefill_tokens=max(8192, 64 * max_batch), prefill_min_rows=max(1, max_batch // 8)))

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        await self.engine.shutdown()

    async def complete(self, messages: list[dict], p: GenParams) -> Completion:
        tok = self.engine.tokenizer
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return await self.generate_ids(tok(text, add_special_tokens=False)["input_ids"], p)

    async def complete_raw(self, prompt: str | list[int], p: GenParams) -> Completion:
        """Continue `prompt` without the chat template; text is tokenized as /v1/completions does."""
        ids = raw_prompt_ids(self.engine.tokenizer, prompt) if isinstance(prompt, str) else prompt
        return await self.generate_ids(ids, p)

    async def generate_ids(self, prompt: list[int], p: GenParams) -> Completion:
        """Continue `prompt` (token ids). The engine thread collects the ids and wakes this
        task once, when the request ends: per-token deltas would cost an event-loop callback
        per request per step, which at hundreds of rows is what limits a GPU's throughput."""
        from engine.api import SamplingParams
        room = self.engine.info.max_context - len(prompt) - 1
        if room < 1:
            raise GenerationFailed(f"prompt of {len(prompt)} tokens does not fit the context")
        params = SamplingParams(max_tokens=min(p.max_tokens, room), temperature=p.temperature, top_p=p.top_p,
                                seed=p.seed, stop_token_ids=list(p.stop_token_ids), detokenize=False)
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        ids: list[int] = []

        def emit(out) -> None:  # engine thread
            ids.extend(out.token_ids)
            if out.finished:
                loop.call_soon_threadsafe(lambda: done.done() or done.set_result(out))

        request_id = uuid.uuid4().hex
        self.engine.submit(request_id, prompt, params, emit)
        try:
            last = await done
        except asyncio.CancelledError:
            self.engine.abort(request_id)
            raise
        if last.error:
            raise GenerationFailed(last.error)
        return Completion(self.engine.tokenizer.decode(ids, skip_special_tokens=True), last.finish_reason, ids)


def make_backend(*, endpoint: str | None, model: str | None, api_key: str | None, target: str | None,
                 concurrency: int, device: str, dtype: str, max_batch: int, max_context: int = 0,
                 **endpoint_options) -> Backend:
    """The backend a pipeline step's flags ask for: --endpoint URL --model NAME, or --target DIR."""
    if endpoint:
        if not model:
            raise ValueError("--endpoint needs --model (the name the endpoint serves)")
        return EndpointBackend(endpoint, model, api_key, concurrency=concurrency, **endpoint_options)
    if target:
        return NativeBackend(target, device=device, dtype=dtype, max_batch=max_batch, max_context=max_context)
    raise ValueError("give --target DIR, or --endpoint URL --model NAME")


async def regenerate_one(conv: Conversation, backend: Backend, p: GenParams) -> dict:
    """Replace every assistant turn by the target's answer to the conversation so far (a raw
    prompt: continue it, without the chat template). Exact token ids are kept when the backend
    has them: decoding then re-encoding text can split tokens differently (or lose partial
    UTF-8), and the drafter must see what the target saw."""
    if conv.raw_prompt is not None:
        c = await backend.complete_raw(conv.raw_prompt, dataclasses.replace(p, max_tokens=p.raw_max_tokens))
        rec = {"id": conv.id, "prompt": conv.raw_prompt, "completion": c.text, "finish_reasons": [c.finish_reason],
               "generated_tokens": c.tokens}
        if c.token_ids is not None:
            rec["completion_ids"] = [c.token_ids]
        return rec
    msgs, finishes, turns, ids, tokens = [], [], 0, [], 0
    for m in conv.messages:
        if m["role"] == "assistant":
            continue
        if m["role"] == "user" and p.max_turns and turns >= p.max_turns:
            break
        msgs.append(m)
        if m["role"] == "user":
            c = await backend.complete(list(msgs), p)
            msgs.append({"role": "assistant", "content": c.text})
            finishes.append(c.finish_reason)
            ids.append(c.token_ids)
            tokens += c.tokens
            turns += 1
    rec = {"id": conv.id, "messages": msgs, "finish_reasons": finishes, "generated_tokens": tokens}
    if any(i is not None for i in ids):
        rec["completion_ids"] = ids
    return rec


def done_ids(path: Path) -> set[str]:
    """Ids already in a generated file; repairs a last line cut by a crash."""
    if not path.exists():
        return set()
    ids, good = set(), 0
    with open(path, "rb") as f:
        for line in f:
            try:
                ids.add(str(json.loads(line)["id"]))
                good += len(line)
            except (json.JSONDecodeError, KeyError, UnicodeDecodeError):
                break
    with open(path, "rb+") as f:
        f.truncate(good)
    return ids


async def within(time_limit_s: float, coro) -> bool:
    """Await `coro`; with a limit > 0, cancel it once the limit has passed (a time-boxed run:
    what is written stays, requests in flight are aborted). True if it finished."""
    if time_limit_s <= 0:
        await coro
        return True
    try:
        await asyncio.wait_for(coro, time_limit_s)
        return True
    except asyncio.TimeoutError:
        return False


async def regenerate(convs: Iterable[Conversation], backend: Backend, out: Path, p: GenParams,
                     concurrency: int = 64, total: int | None = None, time_limit_s: float = 0) -> dict:
    """Stream conversations through `concurrency` workers; append each result as it finishes.
    Stats count this run's conversations, generated tokens (exact ids, or the endpoint's usage)
    and its seconds."""
    done = done_ids(out)
    failures = out.with_name(out.stem + ".failed.jsonl")
    stats = {"skipped": 0, "generated": 0, "failed": 0, "generated_tokens": 0}
    queue: asyncio.Queue = asyncio.Queue(maxsize=2 * concurrency)
    bar = tqdm(total=total, desc="regenerate", unit="conv")
    t0 = time.monotonic()
    with open(out, "a", encoding="utf-8") as f, open(failures, "a", encoding="utf-8") as ff:
        async def worker():
            while (conv := await queue.get()) is not None:
                try:
                    rec = await regenerate_one(conv, backend, p)
                except Exception as e:  # noqa: BLE001 - one bad conversation must not stop the run
                    stats["failed"] += 1
                    ff.write(json.dumps({"id": conv.id, "error": f"{type(e).__name__}: {e}"}) + "\n")
                    ff.flush()
                else:
                    stats["generated"] += 1
                    stats["generated_tokens"] += rec["generated_tokens"]
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    f.flush()
                bar.update(1)

        async def feed():
            for conv in convs:
                if conv.id in done:
                    stats["skipped"] += 1
                    bar.update(1)
                    continue
                done.add(conv.id)
                await queue.put(conv)
            for _ in workers:
                await queue.put(None)
            await asyncio.gather(*workers)

        workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
        try:
            stats["finished"] = await within(time_limit_s, feed())
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            bar.close()
    seconds = time.monotonic() - t0
    stats.update(seconds=round(seconds, 1), conversations_per_s=round(stats["generated"] / seconds, 2),
                 generated_tokens_per_s=round(stats["generated_tokens"] / seconds, 1))
    return stats
