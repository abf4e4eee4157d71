"""Faults never hang a client or leak a slot (live servers, tiny models):
- a burst beyond batch + queue gets 503 with Retry-After (JSON, before any SSE header), the
  rest is served in full, and the server returns to idle;
- a client that drops mid-stream is out of the batch within one engine step, while the
  other streams carry on and finish with exactly their output alone; one that leaves while
  still queued frees its queue place at once;
- a hung engine still answers 504 at the deadline, running and queued requests alike, and
  frees the slots once it moves again;
- an engine that dies mid-run: in-flight streams end with an error event, the non-streamed
  and queued requests get 503, /health turns 503 "dead" and new requests fail fast with 503;
- NativeEngine.shutdown works when the default executor is gone (interpreter exit) and
  answers requests still in the engine.

Faults are injected from outside the engine: the running engine's `decoder.step` and
`decoder.launch` are wrapped to slow down (a big model's step time), block (a hung GPU) or
raise (a failed kernel)."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from engine.api import SamplingParams
from tests import server_harness as h

COMP = "/v1/completions"


def instrument(engine, delay: float = 0.0, gate: threading.Event | None = None,
               fail: threading.Event | None = None) -> list[tuple[float, list[str]]]:
    """Wrap the running engine's decoder steps (device-side launches and host-driven steps):
    log (start time, engine request ids in the batch) per step; sleep `delay`; wait for
    `gate`; raise once `fail` is set."""
    dec, log = engine.decoder, []
    real_step, real_launch = dec.step, dec.launch

    def hook(rows):
        log.append((time.monotonic(), [r.id for r in engine._active[:rows]]))
        if gate is not None:
            gate.wait(60)
        if fail is not None and fail.is_set():
            raise RuntimeError("injected fault: the decoder step failed")
        if delay:
            time.sleep(delay)

    def step(rows, sampling):
        if not dec.device_side(sampling):  # device-side steps are logged by launch
            hook(rows)
        return real_step(rows, sampling)

    def launch(rows):
        hook(rows)
        return real_launch(rows)

    dec.step, dec.launch = step, launch
    return log


def server(speculative=False, **kw):
    app_kw = {k: kw.pop(k) for k in ("request_timeout_s",) if k in kw}
    return h.start_server(h.native_engine(h.models(), speculative=speculative, **kw), **app_kw)


def wait_for(cond, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def body(prompt="import os", max_tokens=24, **kw) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **kw}


async def sse(client: httpx.AsyncClient, url: str, payload: dict, headers=None, first: asyncio.Event | None = None):
    """(status, data events, content type) of one streamed request."""
    async with client.stream("POST", url + COMP, json={**payload, "stream": True}, headers=headers) as r:
        if r.status_code != 200:
            return r.status_code, [json.loads(await r.aread())], r.headers
        events = []
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if first is not None:
                    first.set()
        return 200, events, r.headers


def text_of(events: list[str]) -> str:
    return "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1] if json.loads(e).get("choices"))


def test_burst_beyond_batch_and_queue_gets_503_retry_after_never_a_hang():
    srv = server(max_batch=2, max_waiting=2)
    try:
        instrument(srv.engine, delay=0.02)  # ~25 tokens/s per request: the burst outlives admission
        n = 24

        async def burst():
            async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=n)) as c:
                plain = [c.post(srv.url + COMP, json=body(max_tokens=20, ignore_eos=True)) for _ in range(n // 2)]
                streams = [sse(c, srv.url, body(max_tokens=20, ignore_eos=True)) for _ in range(n // 2)]
                return await asyncio.gather(*plain), await asyncio.gather(*streams)

        t0 = time.monotonic()
        plain, streams = asyncio.run(burst())
        assert time.monotonic() - t0 < 25, "the burst was not answered promptly"
        statuses = [r.status_code for r in plain] + [s for s, _, _ in streams]
        assert set(statuses) <= {200, 503}, statuses
        assert statuses.count(200) >= 4 and statuses.count(503) >= 1, statuses
        for r in plain:
            if r.status_code == 503:
                assert r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "overloaded"
            else:
                assert r.json()["usage"]["completion_tokens"] == 20
        for status, events, headers in streams:
            if status == 503:  # refused before any SSE header went out
                assert headers["content-type"] == "application/json" and headers["retry-after"] == "1"
                assert events[0]["error"]["code"] == "overloaded"
            else:
                assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
        wait_for(lambda: srv.engine.load == (0, 0), what="idle engine")
        assert httpx.post(srv.url + COMP, json=body(max_tokens=4), timeout=30).status_code == 200
    finally:
        srv.stop()


def test_dropped_stream_leaves_the_batch_within_one_step_others_finish_intact():
    srv = server(speculative=True, max_batch=8)
    try:
        keep = h.COMPLETION_PROMPTS[:3]

        async def alone():
            async with httpx.AsyncClient(timeout=60) as c:
                return [await sse(c, srv.url, body(p, max_tokens=40)) for p in keep]
        want = [text_of(ev) for _, ev, _ in asyncio.run(alone())]
        steps = instrument(srv.engine, delay=0.05)  # a 50 ms step, as a large model on a GPU
        closed = {}

        async def drop(c):
            async with c.stream("POST", srv.url + COMP, headers={"x-request-id": "dropper"},
                                json=body("while True:", max_tokens=400, ignore_eos=True, stream=True)) as r:
                got = 0
                async for line in r.aiter_lines():
                    got += line.startswith("data: ")
                    if got == 3:
                        break
            closed["t"] = time.monotonic()  # the connection is closed on leaving the block

        async def run():
            async with httpx.AsyncClient(timeout=60) as c:
                return await asyncio.gather(drop(c), *(sse(c, srv.url, body(p, max_tokens=40)) for p in keep))
        _, *kept = asyncio.run(run())
        wait_for(lambda: srv.engine.load == (0, 0), what="idle engine")
    finally:
        srv.stop()
    with_dropper = [t for t, ids in steps if t > closed["t"] and any(i.startswith("dropper-") for i in ids)]
    assert len(with_dropper) <= 1, f"{len(with_dropper)} engine steps still ran the dropped request"
    after = [ids for t, ids in steps if t > closed["t"] and not any(i.startswith("dropper-") for i in ids)]
    assert after and len(after[0]) >= 1, "the other streams should still be running when the slot is freed"
    for (status, events, _), w in zip(kept, want):
        assert status == 200 and events[-1] == "[DONE]"
        assert text_of(events) == w, "a stream's output changed when a neighbour dropped out"


def test_clients_that_leave_while_queued_free_their_place_at_once():
    """Before the fix the route awaited the first output without watching the connection, so a
    departed client kept its queue place (and later got a prefill) until admitted."""
    srv = server(max_batch=1, max_waiting=4)
    try:
        instrument(srv.engine, delay=0.02)
        t = threading.Thread(target=httpx.post, args=(srv.url + COMP,), daemon=True,
                             kwargs={"json": body(max_tokens=100, ignore_eos=True), "timeout": 60})
        t.start()
        wait_for(lambda: srv.engine.load[0] == 1, what="one running")
        for stream in (True, False):
            with pytest.raises(httpx.TimeoutException):  # the client gives up while queued
                httpx.post(srv.url + COMP, json=body(max_tokens=50, stream=stream), timeout=0.3)
        wait_for(lambda: srv.engine.load == (1, 0), timeout=1.0, what="the queue places freed")
        t.join(60)
        wait_for(lambda: srv.engine.load == (0, 0), what="idle engine")
    finally:
        srv.stop()


def test_hung_engine_answers_504_at_the_deadline_and_frees_the_slots_after():
    srv = server(max_batch=1, request_timeout_s=0.5)
    gate = threading.Event()
    try:
        instrument(srv.engine, gate=gate)  # the first decode step never returns until the gate opens
        result = {}

        def queued():  # waits behind the running request, in the engine's queue
            result["queued"] = httpx.post(srv.url + COMP, json=body(stream=True), timeout=30)
        t0 = time.monotonic()
        t = threading.Thread(target=queued)
        t.start()
        r = httpx.post(srv.url + COMP, json=body(max_tokens=50), timeout=30)
        t.join(30)
        elapsed = time.monotonic() - t0
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout", r.text
        q = result["queued"]
        assert q.status_code == 504 or (q.status_code == 200 and '"code":"timeout"' in q.text.replace(" ", "")), q.text
        assert elapsed < 0.5 + 2.0, f"deadline answer took {elapsed:.1f} s (timeout 0.5 s)"
        gate.set()
        wait_for(lambda: srv.engine.load == (0, 0), what="slots freed after the engine moved again")
        assert httpx.post(srv.url + COMP, json=body(max_tokens=4), timeout=30).status_code == 200
    finally:
        gate.set()
        srv.stop()


def test_engine_death_fails_in_flight_and_new_requests_fast_with_503():
    srv = server(speculative=True, max_batch=2)
    fail = threading.Event()
    try:
        instrument(srv.engine, delay=0.01, fail=fail)
        first = asyncio.Event()
        long = body(max_tokens=300, ignore_eos=True)

        async def scenario():
            async with httpx.AsyncClient(timeout=30) as c:
                running_stream = asyncio.ensure_future(sse(c, srv.url, long, first=first))
                running_plain = asyncio.ensure_future(c.post(srv.url + COMP, json=long))
                await first.wait()
                await asyncio.to_thread(wait_for, lambda: srv.engine.load[0] == 2, 10, "two running")
                queued = [asyncio.ensure_future(sse(c, srv.url, long)),
                          asyncio.ensure_future(c.post(srv.url + COMP, json=long))]
                await asyncio.to_thread(wait_for, lambda: srv.engine.load == (2, 2), 10, "two queued")
                t_fail = time.monotonic()
                fail.set()
                done = await asyncio.gather(running_stream, running_plain, *queued)
                return done, time.monotonic() - t_fail

        (stream, plain, q_stream, q_plain), took = asyncio.run(scenario())
        assert took < 5, f"in-flight requests took {took:.1f} s to fail"
        status, events, _ = stream  # headers were out: the error comes as an event, then [DONE]
        assert status == 200 and events[-1] == "[DONE]"
        err = json.loads(events[-2])["error"]
        assert err["code"] == "engine_unavailable" and "injected fault" in err["message"]
        assert plain.status_code == 503 and plain.json()["error"]["code"] == "engine_unavailable"
        assert q_stream[0] == 503 and q_stream[1][0]["error"]["code"] == "engine_unavailable"
        assert q_plain.status_code == 503

        health = httpx.get(srv.url + "/health", timeout=5)
        assert health.status_code == 503 and health.json()["status"] == "dead"
        assert "injected fault" in health.json()["error"]
        for path, payload in ((COMP, body()), (COMP, body(stream=True)),
                              ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
            t0 = time.monotonic()
            r = httpx.post(srv.url + path, json=payload, timeout=10)
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable", r.text
            assert time.monotonic() - t0 < 1.0
        assert httpx.get(srv.url + "/metrics", timeout=5).status_code == 200
        assert not srv.engine._thread.is_alive()
    finally:
        srv.stop()


def test_shutdown_without_an_executor_answers_what_is_left():
    """At interpreter exit (atexit: tests/server_harness.stop_all) the default executor refuses
    new work; shutdown used asyncio.to_thread and failed with 'cannot schedule new futures'."""
    engine = h.native_engine(h.models(), speculative=False, max_batch=1)

    async def main():
        await engine.start()
        gate = threading.Event()
        instrument(engine, gate=gate)
        gen = engine.generate("left-over", [5, 6, 7], SamplingParams(max_tokens=50, temperature=0))
        first = await gen.__anext__()  # from prefill; the decode step now hangs on the gate
        assert not first.finished
        await asyncio.get_running_loop().shutdown_default_executor()
        stop = asyncio.ensure_future(engine.shutdown())
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.wait_for(stop, 10)
        rest = [o async for o in gen]
        assert rest[-1].finish_reason == "abort" and "shut down" in rest[-1].error
        assert not engine._thread.is_alive() and not engine.ready
    asyncio.run(main())


def test_a_closed_client_loop_does_not_kill_the_engine():
    """A caller of NativeEngine.generate whose event loop closed without finishing the stream
    (no abort reached the engine): its deltas have nowhere to go and are dropped; the engine
    finishes that request and serves the next caller."""
    engine = h.native_engine(h.models(), speculative=True, max_batch=2)
    engine.start_blocking()
    try:
        params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, detokenize=False)
        loop = asyncio.new_event_loop()
        gen = engine.generate("orphan", [5, 6, 7], params)
        assert not loop.run_until_complete(gen.__anext__()).finished
        loop.close()  # the generator is never closed: the engine keeps emitting into a closed loop

        async def alone():
            return [t async for o in engine.generate("next", [5, 6, 7], params) for t in o.token_ids]
        assert len(asyncio.run(asyncio.wait_for(alone(), 30))) == 30  # it hung when the engine thread died
        end = time.monotonic() + 60
        while engine.load != (0, 0) and time.monotonic() < end:   # both requests' rows released
            time.sleep(0.002)
        assert engine.dead is None and engine.ready
    finally:
        engine.stop_blocking()
