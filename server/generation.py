"""One request's engine stream: first output pulled eagerly, deadline, metrics, cleanup.

`start()` pulls the first output before any response is sent, so an overloaded, loading or
failing engine becomes a proper HTTP status instead of a 200 stream that dies. Every output
passes through the request's metrics recorder. Leaving early (client gone, error, timeout)
closes the engine's generator, which aborts the request inside the engine.

The request deadline (--request-timeout) is enforced here and nowhere else: every wait for
the engine runs under a cancel scope at the deadline, and a request not finished by then gets
504 and is aborted. Only this side sees every way a request can be late (waiting in the queue,
running, behind a hung engine step or a dead pipe) for every engine (native in a thread or a
process, SGLang); an engine could only time out the requests it is running, and still needs
the server to answer when it hangs.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import AsyncIterator

import anyio

from engine.api import Engine, EngineError, ErrorCode, GenerationOutput, SamplingParams
from server.errors import APIError, engine_failure
from server.metrics import RequestMetrics

log = logging.getLogger("specserve.server")


class Generation:
    """`timeout_s`: the request's wall-clock deadline from now (None: none)."""

    def __init__(self, engine: Engine, recorder: RequestMetrics, request_id: str, engine_request_id: str,
                 prompt_ids: list[int], params: SamplingParams, timeout_s: float | None):
        self.engine, self.rec = engine, recorder
        self.request_id, self.engine_request_id = request_id, engine_request_id
        self.prompt_ids, self.params, self.timeout_s = prompt_ids, params, timeout_s
        self.deadline = time.monotonic() + timeout_s if timeout_s else math.inf
        self.final: GenerationOutput | None = None
        self._stream = None
        self._first: GenerationOutput | None = None
        self._loop_deadline = math.inf

    async def start(self) -> None:
        # The deadline on the event loop's clock (anyio's), for the cancel scope of every wait.
        self._loop_deadline = anyio.current_time() + (self.deadline - time.monotonic())
        try:
            self._stream = self.engine.generate(self.engine_request_id, self.prompt_ids, self.params)
            self._first = await self._next()
        except EngineError as e:  # an engine that refuses in generate() itself, not at the first item
            err = self._refused(e)
            await self.close("error")
            raise err from None
        except BaseException as e:
            await self.close(_finish_reason(e) if isinstance(e, APIError) else "abort")
            raise

    async def outputs(self) -> AsyncIterator[GenerationOutput]:
        """The outputs, first one included; raises APIError if the engine fails midway."""
        out, reason = self._first, "abort"
        try:
            yield out
            while not out.finished:
                out = await self._next()
                yield out
            reason = out.finish_reason
        except APIError as e:
            reason = _finish_reason(e)
            raise
        finally:
            await self.close(reason)

    async def _next(self) -> GenerationOutput:
        try:
            # A bare cancel scope at the deadline, not anyio.fail_after(remaining): this runs once per
            # streamed delta (and an engine in a thread of this process waits for it: one GIL).
            with anyio.CancelScope(deadline=self._loop_deadline) as scope:
                out = await self._stream.__anext__()
        except StopAsyncIteration:
            raise APIError(500, "the engine ended the stream without a finish reason", code="engine_error") from None
        except EngineError as e:
            raise self._refused(e) from None
        if scope.cancelled_caught:
            raise self._timeout()
        self.rec.on_output(out)
        if out.finished:
            self.final = out
        if out.error:
            raise engine_failure(out.error_code or ErrorCode.ENGINE_ERROR, out.error)
        return out

    def _refused(self, e: EngineError) -> APIError:
        self.rec.discard()  # never reached the engine's queue: not counted
        return engine_failure(e.code, str(e))

    def _timeout(self) -> APIError:
        return engine_failure(ErrorCode.TIMEOUT, f"request timed out after {self.timeout_s:g} s")

    async def close(self, reason: str) -> None:
        """Record the end once and make sure the engine forgets the request."""
        final = self.final if self.final is not None and not self.final.error else None
        self.rec.finish(final.finish_reason if final is not None else reason, final, len(self.prompt_ids))
        stream, self._stream = self._stream, None
        if stream is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await stream.aclose()
                except Exception:
                    log.exception("[%s] closing the engine stream failed", self.request_id)


def _finish_reason(e: APIError) -> str:
    """The metrics' finish reason of a failed request: a timeout is an abort, like a client gone."""
    return "abort" if e.code == ErrorCode.TIMEOUT else "error"


async def cancel_on_disconnect(request, coro):
    """Run `coro`; if the client disconnects first, cancel it (which closes the engine stream,
    aborting the generation) and raise ClientGone."""
    task = asyncio.ensure_future(coro)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # we are cancelled ourselves (server shutdown)
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    try:
        await task
    except BaseException:
        pass
    raise ClientGone()


async def _disconnected(request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class ClientGone(Exception):
    """The client disconnected before the response was ready."""
