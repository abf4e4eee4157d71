"""Concurrency against a live speculative server: 16 simultaneous streams each produce exactly
what the same request produces alone; a client that disconnects mid-stream stops its
generation; a full queue answers 503 with Retry-After; a request past its deadline gets an
error (504), not a hang."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import server_harness as h


def body(server, prompt: str, **kw) -> dict:
    return {"model": server.model, "prompt": prompt, "max_tokens": h.MAX_TOKENS, "temperature": 0, **kw}


async def stream_text(client: httpx.AsyncClient, server, prompt: str) -> tuple[str, int]:
    text, usage = [], None
    async with client.stream("POST", server.url + "/v1/completions",
                             json=body(server, prompt, stream=True, stream_options={"include_usage": True})) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"]:
                text.append(chunk["choices"][0]["text"])
            if chunk.get("usage"):
                usage = chunk["usage"]
    return "".join(text), usage["completion_tokens"]


def gauges(server) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + ("" if not s.labels else json.dumps(s.labels, sort_keys=True))
            out[key] = s.value
    return out


def test_16_concurrent_streams_each_equal_to_the_request_alone(spec):
    prompts = h.COMPLETION_PROMPTS[:16]

    async def run():
        async with httpx.AsyncClient(timeout=120) as client:
            alone = [await stream_text(client, spec, p) for p in prompts]
            together = await asyncio.gather(*(stream_text(client, spec, p) for p in prompts))
        return alone, together

    alone, together = asyncio.run(run())
    assert len(together) == 16
    for p, a, t in zip(prompts, alone, together):
        assert t == a, f"prompt {p!r}: concurrent output differs from the output alone"
        assert a[1] == h.MAX_TOKENS
    assert len({a[0] for a in alone}) > 8, "prompts should give different outputs (no cross-talk hidden)"


def test_client_disconnect_mid_stream_cancels_the_generation(spec):
    before = gauges(spec)
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", spec.url + "/v1/completions",
                           json=body(spec, "import os", max_tokens=480, ignore_eos=True, stream=True)) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = 0
            for line in lines:
                if line.startswith("data: "):
                    got += 1
                if got == 3:
                    break
        # leaving the `with` closes the connection mid-stream
    deadline = time.monotonic() + 10
    while True:
        after = gauges(spec)
        aborted = after['specserve_requests_total{"finish_reason": "abort"}'] - \
            before['specserve_requests_total{"finish_reason": "abort"}']
        if aborted == 1 and after["specserve_num_requests_running"] == 0:
            break
        assert time.monotonic() < deadline, "the generation was not cancelled after the client left"
        time.sleep(0.05)
    generated = after["specserve_generation_tokens_total"] - before["specserve_generation_tokens_total"]
    assert generated < 480, "the engine kept generating for a client that was gone"


@pytest.fixture(scope="module")
def one_slot():
    """A server that decodes one request at a time and queues at most one more."""
    srv = h.start_server(h.native_engine(h.models(), speculative=False, max_batch=1, max_waiting=1))
    yield srv
    srv.stop()


def test_full_queue_answers_503_with_retry_after_then_recovers(one_slot):
    srv = one_slot
    results = {}
    before = gauges(srv)
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", srv.url + "/v1/completions",
                           json=body(srv, "import os", max_tokens=480, ignore_eos=True, stream=True)) as r:
            assert r.status_code == 200
            lines = r.iter_lines()  # keep a reference: a dropped line iterator closes the connection
            next(line for line in lines if line.startswith("data: "))  # running now

            def queued():
                results["queued"] = httpx.post(srv.url + "/v1/completions", json=body(srv, "try:", max_tokens=4),
                                               timeout=60)
            t = threading.Thread(target=queued)
            t.start()
            deadline = time.monotonic() + 10
            while gauges(srv)["specserve_num_requests_waiting"] < 1:
                assert time.monotonic() < deadline, "second request never queued"
                time.sleep(0.01)
            over = client.post(srv.url + "/v1/completions", json=body(srv, "x = 1", max_tokens=4))
            over_stream = client.post(srv.url + "/v1/completions", json=body(srv, "x = 1", max_tokens=4, stream=True))
        # the long stream is abandoned here, which frees the slot for the queued request
    t.join(60)
    assert over.status_code == 503, over.text
    assert over.headers["retry-after"] == "1"
    assert over.json()["error"]["code"] == "overloaded" and over.json()["error"]["type"] == "server_error"
    # a stream is refused the same way, before any SSE header goes out
    assert over_stream.status_code == 503 and over_stream.headers["content-type"] == "application/json"
    assert results["queued"].status_code == 200
    assert results["queued"].json()["usage"]["completion_tokens"] == 4
    after = gauges(srv)
    finished = {r: after[f'specserve_requests_total{{"finish_reason": "{r}"}}'] -
                before[f'specserve_requests_total{{"finish_reason": "{r}"}}'] for r in ("length", "abort", "error")}
    assert finished == {"length": 1, "abort": 1, "error": 0}, "a refused request must not count as finished"


@pytest.fixture(scope="module")
def short_timeout():
    srv = h.start_server(h.native_engine(h.models(), speculative=False, max_batch=1), request_timeout_s=0.2)
    yield srv
    srv.stop()


def test_request_past_its_deadline_gets_504_not_a_hang(short_timeout):
    srv = short_timeout
    t0 = time.monotonic()
    r = httpx.post(srv.url + "/v1/completions", json=body(srv, "import os", max_tokens=480, ignore_eos=True),
                   timeout=30)
    assert r.status_code == 504, r.text
    assert r.json()["error"]["code"] == "timeout"
    assert time.monotonic() - t0 < 10
    # Streaming: either refused before the headers (504) or ended by an error event, then [DONE].
    with httpx.stream("POST", srv.url + "/v1/completions", timeout=30,
                      json=body(srv, "import os", max_tokens=480, ignore_eos=True, stream=True)) as s:
        if s.status_code == 200:
            events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            assert json.loads(events[-2])["error"]["code"] == "timeout"
        else:
            assert s.status_code == 504
    deadline = time.monotonic() + 10
    while gauges(srv)["specserve_num_requests_running"] != 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
