"""The native engine in its own process (engine/process.py), as `python -m server` runs it,
behind a live server (tiny models; the harness's spec server is one too):
- it streams exactly what the in-thread engine streams, concurrent requests included;
- the waiting queue's limit still answers 503 overloaded (refused inside the child);
- a client that leaves mid-stream frees its slot in the child;
- a killed engine process: open streams end with an error event at once, /health turns 503
  "dead" and new requests fail fast, while the server itself keeps answering;
- stopping the server leaves no child process behind;
- the child's half of the pipe protocol, with a real engine whose thread dies."""
from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import threading
import time

import httpx
import pytest

from tests import server_harness as h
from tests.test_reliability_faults import COMP, body, sse, text_of, wait_for
from tests.test_server_metrics import scrape, value


def start(**kw) -> h.LiveServer:
    return h.start_server(h.process_engine(h.models(), speculative=False, **kw))


def child_pid(srv: h.LiveServer) -> int:
    return srv.engine._proc.pid


async def long_stream(client: httpx.AsyncClient, url: str) -> asyncio.Future:
    """A long streamed request, once its first event has arrived."""
    first = asyncio.Event()
    stream = asyncio.ensure_future(sse(client, url, body(max_tokens=300, ignore_eos=True), first=first))
    await first.wait()
    return stream


@pytest.fixture(scope="module")
def srv():
    s = start(max_batch=4)
    yield s
    s.stop()


def test_streams_what_the_in_thread_engine_streams(srv):
    prompts = h.COMPLETION_PROMPTS[:6]

    async def run(url):
        async with httpx.AsyncClient(timeout=60) as c:
            return await asyncio.gather(*(sse(c, url, body(p, max_tokens=h.MAX_TOKENS)) for p in prompts))

    ours, in_thread = asyncio.run(run(srv.url)), asyncio.run(run(h.plain_server().url))
    for (status, events, _), (_, want, _) in zip(ours, in_thread):
        assert status == 200 and events[-1] == "[DONE]"
        assert text_of(events) == text_of(want) and text_of(events)
    assert srv.engine.info.device == "cpu" and srv.engine.info.max_context > 0  # filled in by the child


def test_client_leaving_mid_stream_frees_its_slot_in_the_child(srv):
    """Leaving after the first event aborts the request in the child (finish reason "abort") and
    frees its slot. 400 tokens take the tiny model about half a second, so on a loaded machine the
    request can end on its own first ("length"); such a try is repeated."""
    def ended() -> tuple[float, float]:
        m = scrape(srv)
        return tuple(value(m, "specserve_requests_total", finish_reason=r) for r in ("abort", "length"))

    for _ in range(5):
        before = ended()
        with httpx.stream("POST", srv.url + COMP, json=body(max_tokens=400, ignore_eos=True, stream=True),
                          timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break
        wait_for(lambda: srv.engine.load == (0, 0) and sum(ended()) == sum(before) + 1, what="the request to end")
        if ended()[0] == before[0] + 1:
            return
    pytest.fail("five requests of 400 tokens ended before their client left")


def test_full_queue_is_refused_with_503_overloaded():
    s = start(max_batch=1, max_waiting=1)
    try:
        async def run():
            async with httpx.AsyncClient(timeout=60) as c:
                running = await long_stream(c, s.url)
                queued = asyncio.ensure_future(sse(c, s.url, body(max_tokens=2)))
                await asyncio.to_thread(wait_for, lambda: s.engine.load == (1, 1), 10, "one queued")
                refused = await c.post(s.url + COMP, json=body())
                return refused, await running, await queued

        refused, running, queued = asyncio.run(run())
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "overloaded"
        assert refused.headers["retry-after"]
        assert running[0] == queued[0] == 200 and running[1][-1] == queued[1][-1] == "[DONE]"
    finally:
        s.stop()


def test_killed_engine_process_fails_open_requests_fast_and_health_turns_dead():
    s = start()
    try:
        async def run():
            async with httpx.AsyncClient(timeout=30) as c:
                stream = await long_stream(c, s.url)
                t0 = time.monotonic()
                os.kill(child_pid(s), signal.SIGKILL)
                return await stream, time.monotonic() - t0

        (status, events, _), took = asyncio.run(run())
        assert took < 5, f"the open stream took {took:.1f} s to fail"
        assert status == 200 and events[-1] == "[DONE]"
        err = json.loads(events[-2])["error"]
        assert err["code"] == "engine_unavailable" and "engine process died" in err["message"]
        health = httpx.get(s.url + "/health", timeout=5)
        assert health.status_code == 503 and health.json()["status"] == "dead"
        t0 = time.monotonic()
        r = httpx.post(s.url + COMP, json=body(), timeout=10)
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
        assert time.monotonic() - t0 < 1.0
        assert httpx.get(s.url + "/metrics", timeout=5).status_code == 200
    finally:
        s.stop()


def test_server_stop_leaves_no_engine_process():
    s = start()
    pid = child_pid(s)
    assert httpx.post(s.url + COMP, json=body(), timeout=30).status_code == 200
    s.stop()
    assert not s.engine._proc.is_alive()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_engine_side_speaks_the_pipe_protocol_and_reports_a_dead_engine():
    """The child's half (engine/process._EngineSide) over a real pipe with a real engine in
    this process: deltas come one message per loop turn, a full queue is refused, an abort
    frees the row, and when the engine thread dies it says so once, before the last deltas
    of the requests it fails (the server then turns /health dead)."""
    from engine.api import ErrorCode, SamplingParams
    from engine.messages import Abort, Dead, Outputs, Refused, Stop, Submit
    from engine.process import _EngineSide
    from tests.test_reliability_faults import instrument

    engine = h.native_engine(h.models(), speculative=False, max_batch=1, max_waiting=1)
    engine.start_blocking()
    server_end, child_end = multiprocessing.Pipe()
    side = _EngineSide(engine, child_end)
    serving = threading.Thread(target=side.serve, daemon=True)
    serving.start()
    fail = threading.Event()
    instrument(engine, delay=0.01, fail=fail)
    long = SamplingParams(max_tokens=300, temperature=0, ignore_eos=True)

    def until(pred, what):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if server_end.poll(0.1) and pred(msg := server_end.recv()):
                return msg
        raise AssertionError(f"no {what} message")

    try:
        server_end.send(Submit("a", [5, 6, 7], long))
        out = until(lambda m: isinstance(m, Outputs) and m.deltas, "first delta")
        assert out.deltas[0][0] == "a" and out.deltas[0][1].token_ids
        server_end.send(Submit("b", [5, 6], long))  # waits: max_batch 1
        server_end.send(Submit("c", [5], long))     # the queue (1) is full
        refused = until(lambda m: isinstance(m, Refused), "refused")
        assert (refused.request_id, refused.code) == ("c", ErrorCode.OVERLOADED)
        server_end.send(Abort("a"))  # b takes a's row
        until(lambda m: isinstance(m, Outputs) and any(rid == "b" for rid, _ in m.deltas), "b's first delta")
        fail.set()
        dead = until(lambda m: isinstance(m, Dead), "dead engine")
        assert "injected fault" in dead.reason
        last = until(lambda m: isinstance(m, Outputs) and m.deltas, "the failed requests' last deltas")
        assert any(rid == "b" and o.finish_reason == "abort" and o.error_code == ErrorCode.ENGINE_UNAVAILABLE
                   for rid, o in last.deltas)
    finally:
        server_end.send(Stop())
        serving.join(30)
    assert not serving.is_alive()
