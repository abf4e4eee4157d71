"""Engine outputs -> OpenAI response bodies and SSE streams (chat and text completions).

Streams follow OpenAI: `data: {json}\\n\\n` per chunk; chat starts with a role chunk; the
finish reason rides on the chunk with the last text; with stream_options.include_usage a
final chunk with empty choices carries usage (and usage.spec_decoding); then `data: [DONE]`.
An error after the headers went out is sent as `data: {"error": {...}}` before [DONE], as
vLLM does. With n > 1 every choice is its own engine request (its own format object, index
and logprobs state); their deltas are interleaved as they come, and usage sums them (the
prompt counted once, as OpenAI does).
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import logging
import time

import anyio
from starlette.responses import StreamingResponse

from engine.api import GenerationOutput, SpecStats
from server.errors import APIError
from server.generation import Generation
from server.logprobs import LogprobFormatter
from server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    CompletionChoice,
    CompletionResponse,
    SpecDecodingUsage,
    Usage,
)
from server.tools import OutputParser, ParsedOutput, calls_from_json

log = logging.getLogger("specserve.server")

DONE = b"data: [DONE]\n\n"


def sse(payload: str) -> bytes:
    return b"data: " + payload.encode() + b"\n\n"


_compact_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode  # as pydantic writes it


def delta_chunk(template: dict, **choice) -> bytes:
    """One streamed delta: `template`, a one-choice chunk that pydantic dumped once per response,
    with `choice`'s fields replaced: building and serializing pydantic models for every token
    is the event loop's largest per-token cost."""
    return sse(_compact_json({**template, "choices": [{**template["choices"][0], **choice}]}))


def usage_of(final: GenerationOutput) -> Usage:
    spec = None
    if final.spec is not None:
        s = final.spec
        spec = SpecDecodingUsage(
            verify_steps=s.verify_steps, proposed_draft_tokens=s.proposed_draft_tokens,
            accepted_draft_tokens=s.accepted_draft_tokens, accepted_per_position=list(s.accepted_per_position),
            accept_length=round(s.accept_length(final.completion_tokens), 4), accept_rate=round(s.accept_rate, 4))
    return Usage(prompt_tokens=final.prompt_tokens, completion_tokens=final.completion_tokens,
                 total_tokens=final.prompt_tokens + final.completion_tokens, spec_decoding=spec)


def log_fields(final: GenerationOutput | None) -> dict:
    """What the access log prints for a finished request."""
    if final is None:
        return {}
    u = usage_of(final)
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "accept_length": u.spec_decoding.accept_length if u.spec_decoding else None,
            "finish_reason": final.finish_reason}


class _Choice:
    """What every format keeps per choice: its index and its logprobs formatter (None: none asked)."""
    index: int = 0
    logprobs: LogprobFormatter | None = None

    def choice(self, index: int, logprobs: LogprobFormatter | None):
        self.index, self.logprobs = index, logprobs
        self._template["choices"][0]["index"] = index
        return self

    def lp(self, ids: list[int], lps) -> dict | None:
        return self.logprobs.format(ids, lps or []) if self.logprobs is not None else None


class ChatFormat(_Choice):
    """`parser`: the request's tool-call and reasoning parsing (server/tools.py), None for plain
    text. `json_calls`: the output is the JSON array of calls that a grammar forced (tool_choice
    required or named, a model without a tool format): streamed whole, as one delta at the end."""

    def __init__(self, response_id: str, model: str, parser: OutputParser | None = None, json_calls: bool = False):
        self.parser, self.json_calls, self._held = parser, json_calls, []
        self.id, self.model, self.created = response_id, model, int(time.time())
        self._template = self._model(ChatDelta()).model_dump(exclude={"usage"})

    def head(self) -> list[bytes]:
        return [delta_chunk(self._template, delta={"role": "assistant", "content": ""})]

    def chunk(self, text: str, finish_reason: str | None, logprobs: dict | None = None) -> bytes:
        """b"" when there is nothing to send yet (a parser holds the text back)."""
        if self.parser is None:
            return delta_chunk(self._template, delta={"content": text} if text else {}, finish_reason=finish_reason,
                               logprobs=logprobs)
        if self.json_calls:
            self._held.append(text)
            if finish_reason is None and not logprobs:
                return b""
            parsed = ParsedOutput()
            if finish_reason is not None:
                parsed = self._parse_json_calls("".join(self._held))
                parsed.tool_calls = [{"index": i, **c} for i, c in enumerate(parsed.tool_calls)]
        else:
            parsed = self.parser.delta(text, final=finish_reason is not None)
        if not parsed and finish_reason is None and not logprobs:
            return b""
        delta = {k: v for k, v in (("reasoning_content", parsed.reasoning), ("content", parsed.content),
                                   ("tool_calls", parsed.tool_calls)) if v}
        called = self.parser.called or bool(parsed.tool_calls)
        return delta_chunk(self._template, delta=delta, finish_reason=_tool_finish(finish_reason, called),
                           logprobs=logprobs)

    def _parse_json_calls(self, text: str) -> ParsedOutput:
        calls = calls_from_json(text, self.parser.parser_name, self.parser.history_calls)
        return ParsedOutput(tool_calls=calls) if calls else ParsedOutput(content=text)

    def _model(self, delta: ChatDelta) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model,
                                   choices=[ChatChunkChoice(delta=delta)])

    def usage_chunk(self, usage: Usage) -> bytes:
        return sse(ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[],
                                       usage=usage).model_dump_json())

    def full(self, text: str, final: GenerationOutput, logprobs: dict | None = None) -> dict:
        message, reason = AssistantMessage(content=text), final.finish_reason
        if self.parser is not None:
            parsed = self._parse_json_calls(text) if self.json_calls else self.parser.full(text)
            message = AssistantMessage(content=parsed.content or (None if parsed.tool_calls else ""),
                                       reasoning_content=parsed.reasoning or None,
                                       tool_calls=parsed.tool_calls or None)
            reason = _tool_finish(reason, bool(parsed.tool_calls))
        body = ChatCompletionResponse(
            id=self.id, created=self.created, model=self.model, usage=usage_of(final),
            choices=[ChatChoice(message=message, finish_reason=reason)],
        ).model_dump()
        body["choices"][0].update(index=self.index, logprobs=logprobs)
        return body


def _tool_finish(reason: str | None, called: bool) -> str | None:
    """OpenAI's finish_reason "tool_calls": the model stopped after calling (SGLang's rule)."""
    return "tool_calls" if called and reason == "stop" else reason


class CompletionFormat(_Choice):
    """`echo`: the prompt's text, sent before the completion (request field echo)."""

    def __init__(self, response_id: str, model: str, echo: str = ""):
        self.id, self.model, self.created, self.echo = response_id, model, int(time.time()), echo
        self._template = CompletionResponse(id=self.id, created=self.created, model=self.model,
                                            choices=[CompletionChoice(text="")]).model_dump(exclude={"usage"})

    def head(self) -> list[bytes]:
        return [self.chunk(self.echo, None)] if self.echo else []

    def chunk(self, text: str, finish_reason: str | None, logprobs: dict | None = None) -> bytes:
        return delta_chunk(self._template, text=text, finish_reason=finish_reason, logprobs=logprobs)

    def usage_chunk(self, usage: Usage) -> bytes:
        return sse(CompletionResponse(id=self.id, created=self.created, model=self.model, choices=[],
                                      usage=usage).model_dump_json())

    def full(self, text: str, final: GenerationOutput, logprobs: dict | None = None) -> dict:
        body = CompletionResponse(
            id=self.id, created=self.created, model=self.model, usage=usage_of(final),
            choices=[CompletionChoice(text=self.echo + text, finish_reason=final.finish_reason)],
        ).model_dump()
        body["choices"][0].update(index=self.index, logprobs=logprobs)
        return body


def choice_formats(fmt, n: int, logprobs_k: int | None, tokenizer) -> list:
    """One format per choice (index, logprobs state), copies of `fmt` made before any output."""
    fmts = [fmt] + [copy.deepcopy(fmt) for _ in range(n - 1)]
    chat = isinstance(fmt, ChatFormat)
    return [f.choice(i, LogprobFormatter(tokenizer, chat) if logprobs_k is not None else None)
            for i, f in enumerate(fmts)]


def choice_generations(make, params, n: int) -> list[Generation]:
    """n Generations (make(params) each); a seed given is seed + i for choice i, so that the
    choices differ and each can be reproduced."""
    def seed(i):  # within torch's range: past 2**64 - 1 it wraps around
        return params.seed + i if params.seed + i < 1 << 64 else params.seed + i - (1 << 64)
    return [make(params if i == 0 or params.seed is None else dataclasses.replace(params, seed=seed(i)))
            for i in range(n)]


async def start_all(gens: list[Generation]) -> None:
    """Start every choice; if one fails (overloaded, a grammar that does not compile), close the
    others and raise its error."""
    if len(gens) == 1:
        return await gens[0].start()
    results = await asyncio.gather(*(g.start() for g in gens), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        for g in gens:
            await g.close("abort")
        raise errors[0]


def merged_final(finals: list[GenerationOutput | None]) -> GenerationOutput | None:
    """The choices' last outputs as one, for usage and the access log: completion tokens and
    speculative counts summed, the prompt once."""
    if len(finals) == 1 or any(f is None for f in finals):
        return finals[0] if len(finals) == 1 else None
    spec = None
    for f in finals:
        spec = f.spec.plus(spec) if f.spec is not None else spec
    return GenerationOutput(finish_reason=finals[-1].finish_reason, prompt_tokens=finals[0].prompt_tokens,
                            completion_tokens=sum(f.completion_tokens for f in finals),
                            spec=spec if spec is not None else (SpecStats() if finals[0].spec else None))


async def choice_outputs(gens: list[Generation]):
    """(choice index, output) of every generation as they arrive; all closed when done."""
    if len(gens) == 1:
        async with contextlib.aclosing(gens[0].outputs()) as outputs:
            async for out in outputs:
                yield 0, out
        return
    iters = [g.outputs() for g in gens]
    pending = {asyncio.ensure_future(anext(it)): i for i, it in enumerate(iters)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for f in sorted(done, key=pending.get):
                i = pending.pop(f)
                try:
                    out = f.result()
                except StopAsyncIteration:
                    continue
                yield i, out
                pending[asyncio.ensure_future(anext(iters[i]))] = i
    finally:
        with anyio.CancelScope(shield=True):
            for f in pending:
                f.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for it in iters:
                await it.aclose()


async def collect(gens: list[Generation], fmts: list) -> tuple[dict, GenerationOutput]:
    """The whole response body of every choice, and their merged final output."""
    parts = [[] for _ in gens]
    ids, lps = [[] for _ in gens], [[] for _ in gens]
    async for i, out in choice_outputs(gens):
        parts[i].append(out.text)
        if fmts[i].logprobs is not None:
            ids[i] += out.token_ids
            lps[i] += out.logprobs or []
    bodies = [fmt.full("".join(p), g.final, fmt.lp(i_, lp)) for fmt, p, g, i_, lp in zip(fmts, parts, gens, ids, lps)]
    final = merged_final([g.final for g in gens])
    body = bodies[0]
    if len(bodies) > 1:
        body["choices"] = [b["choices"][0] for b in bodies]
        body["usage"] = usage_of(final).model_dump()
    return body, final


async def sse_events(gens: list[Generation], fmts: list, include_usage: bool, state: dict):
    """The SSE byte stream of one request (one Generation and format per choice); `state`
    receives the access-log fields."""
    try:
        for fmt in fmts:
            for chunk in fmt.head():
                yield chunk
        async for i, out in choice_outputs(gens):
            if out.text or out.finished or out.logprobs:
                fmt = fmts[i]
                chunk = fmt.chunk(out.text, out.finish_reason, fmt.lp(out.token_ids, out.logprobs))
                if chunk:  # b"": a parser holds the text back
                    yield chunk
        if include_usage:
            yield fmts[0].usage_chunk(usage_of(merged_final([g.final for g in gens])))
    except APIError as e:
        log.warning("[%s] stream ended with an error: %s", gens[0].request_id, e.message)
        yield sse(json.dumps(e.body()))
    finally:
        state["usage"] = log_fields(merged_final([g.final for g in gens])) or {
            "prompt_tokens": len(gens[0].prompt_ids), "completion_tokens": sum(g.rec.tokens for g in gens),
            "finish_reason": "abort"}
    yield DONE


class EventStreamResponse(StreamingResponse):
    """A text/event-stream response that cancels its producer as soon as the client leaves
    (whether the server reports that as http.disconnect or as a failing send) and always
    closes the producer, so an abandoned request never keeps generating."""
    media_type = "text/event-stream"

    def __init__(self, content, headers: dict[str, str] | None = None):
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def stream():
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client went away (ASGI 2.4 servers report it this way)
                        pass
                    except Exception:
                        log.exception("[%s] streaming failed", scope.get("state", {}).get("request_id", "-"))
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
