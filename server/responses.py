"""Engine outputs -> OpenAI response bodies and SSE streams (chat and text completions).

Streams follow OpenAI: `data: {json}\\n\\n` per chunk; chat starts with a role chunk; the
finish reason rides on the chunk with the last text; with stream_options.include_usage a
final chunk with empty choices carries usage (and usage.spec_decoding); then `data: [DONE]`.
An error after the headers went out is sent as `data: {"error": {...}}` before [DONE], as
vLLM does.
"""
from __future__ import annotations

import contextlib
import json
import logging
import time

import anyio
from starlette.responses import StreamingResponse

from engine.api import GenerationOutput
from server.errors import APIError
from server.generation import Generation
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

log = logging.getLogger("specserve.server")

DONE = b"data: [DONE]\n\n"


def sse(payload: str) -> bytes:
    return b"data: " + payload.encode() + b"\n\n"


_compact_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode  # as pydantic writes it


def delta_chunk(template: dict, **choice) -> bytes:
    """One streamed delta: `template`, a one-choice chunk that pydantic dumped once per response,
    with `choice`'s fields replaced: building and serializing pydantic models for every token
    is the event loop's largest per-token cost (benchmarks/results/http_overhead/)."""
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


class ChatFormat:
    def __init__(self, response_id: str, model: str):
        self.id, self.model, self.created = response_id, model, int(time.time())
        self._template = self._model(ChatDelta()).model_dump(exclude={"usage"})

    def head(self) -> list[bytes]:
        return [sse(self._model(ChatDelta(role="assistant", content="")).model_dump_json(exclude={"usage"}))]

    def chunk(self, text: str, finish_reason: str | None) -> bytes:
        return delta_chunk(self._template, delta={"content": text} if text else {}, finish_reason=finish_reason)

    def _model(self, delta: ChatDelta) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model,
                                   choices=[ChatChunkChoice(delta=delta)])

    def usage_chunk(self, usage: Usage) -> bytes:
        return sse(ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[],
                                       usage=usage).model_dump_json())

    def full(self, text: str, final: GenerationOutput) -> dict:
        return ChatCompletionResponse(
            id=self.id, created=self.created, model=self.model, usage=usage_of(final),
            choices=[ChatChoice(message=AssistantMessage(content=text), finish_reason=final.finish_reason)],
        ).model_dump()


class CompletionFormat:
    def __init__(self, response_id: str, model: str):
        self.id, self.model, self.created = response_id, model, int(time.time())
        self._template = CompletionResponse(id=self.id, created=self.created, model=self.model,
                                            choices=[CompletionChoice(text="")]).model_dump(exclude={"usage"})

    def head(self) -> list[bytes]:
        return []

    def chunk(self, text: str, finish_reason: str | None) -> bytes:
        return delta_chunk(self._template, text=text, finish_reason=finish_reason)

    def usage_chunk(self, usage: Usage) -> bytes:
        return sse(CompletionResponse(id=self.id, created=self.created, model=self.model, choices=[],
                                      usage=usage).model_dump_json())

    def full(self, text: str, final: GenerationOutput) -> dict:
        return CompletionResponse(
            id=self.id, created=self.created, model=self.model, usage=usage_of(final),
            choices=[CompletionChoice(text=text, finish_reason=final.finish_reason)],
        ).model_dump()


async def collect(gen: Generation) -> tuple[str, GenerationOutput]:
    parts = []
    async with contextlib.aclosing(gen.outputs()) as outputs:
        async for out in outputs:
            parts.append(out.text)
    return "".join(parts), gen.final


async def sse_events(gen: Generation, fmt: ChatFormat | CompletionFormat, include_usage: bool, state: dict):
    """The SSE byte stream of one request; `state` receives the access-log fields."""
    try:
        for chunk in fmt.head():
            yield chunk
        async with contextlib.aclosing(gen.outputs()) as outputs:
            async for out in outputs:
                if out.text or out.finished:
                    yield fmt.chunk(out.text, out.finish_reason)
        if include_usage:
            yield fmt.usage_chunk(usage_of(gen.final))
    except APIError as e:
        log.warning("[%s] stream ended with an error: %s", gen.request_id, e.message)
        yield sse(json.dumps(e.body()))
    finally:
        state["usage"] = log_fields(gen.final) or {"prompt_tokens": len(gen.prompt_ids),
                                                   "completion_tokens": gen.rec.tokens, "finish_reason": "abort"}
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
