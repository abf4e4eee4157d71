"""Fuzzing: schemathesis generates requests from the server's own /openapi.json (valid and
invalid bodies for both completion routes, plus the GET routes) and sends them to a live
speculative server; none may get a 5xx, and the server is healthy and serves correctly
afterwards. The context is capped at 64 tokens so generated max_tokens values stay cheap.

Found so far, each killing the engine thread for every client: a huge `top_k` (2**70)
overflowed an int64 tensor (fixed in server/prompts.py); a tiny `top_p` (1e-300) is 0.0 in
float32, top-p then dropped every token and sampling got NaN (fixed in engine/sampling.py)."""
from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from tests import server_harness as h
from tests.test_reliability_faults import wait_for

EXAMPLES = 50  # per body route and generation mode


@pytest.fixture(scope="module")
def fuzz_server():
    srv = h.start_server(h.native_engine(h.models(), speculative=True, max_context=64))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    return schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")


# (method, path, generation modes, examples per mode). The GET routes take no input: a few calls.
OPERATIONS = [
    ("POST", "/v1/chat/completions", (GenerationMode.POSITIVE, GenerationMode.NEGATIVE), EXAMPLES),
    ("POST", "/v1/completions", (GenerationMode.POSITIVE, GenerationMode.NEGATIVE), EXAMPLES),
    ("GET", "/v1/models", (GenerationMode.POSITIVE,), 3),
    ("GET", "/health", (GenerationMode.POSITIVE,), 3),
    ("GET", "/metrics", (GenerationMode.POSITIVE,), 3),
]
CASES = [(m, p, mode, n) for m, p, modes, n in OPERATIONS for mode in modes]


def test_every_operation_is_fuzzed(api_schema):
    ops = {(r.ok().method.upper(), r.ok().path) for r in api_schema.get_all_operations()}
    assert ops == {(m, p) for m, p, *_ in OPERATIONS}


@pytest.mark.parametrize("method,path,mode,examples", CASES, ids=[f"{m} {p} {mode.value}" for m, p, mode, _ in CASES])
def test_fuzzed_requests_never_get_a_5xx(api_schema, fuzz_server, method, path, mode, examples):
    # schemathesis' own pytest integration (schema.parametrize) breaks on pytest 9 (it reads
    # request.node._nodeid), so the operation's strategy is driven with hypothesis directly.
    operation = api_schema[path][method]

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def fuzz(case):
        case.call_and_validate(base_url=fuzz_server.url, checks=[not_a_server_error], timeout=60)

    fuzz()


def _sampling_fields():
    """Valid requests at the edges of every sampling field (schemathesis' schema-driven cases
    are mostly refused with 400 by the cross-field rules, so few reach the engine)."""
    floats = st.floats(allow_nan=False, allow_infinity=False)
    return st.fixed_dictionaries({"max_tokens": st.integers(1, 24)}, optional={
        "temperature": st.one_of(st.just(0.0), floats.filter(lambda x: x >= 0), st.sampled_from([1e-300, 1e300])),
        "top_p": st.one_of(st.floats(min_value=1e-300, max_value=1.0), st.sampled_from([1e-300, 1.0])),
        "top_k": st.one_of(st.integers(-1, 600), st.integers(min_value=-1), st.just(2**70)),
        "seed": st.integers(-(1 << 63), (1 << 64) - 1),
        "stop": st.one_of(st.text(max_size=8), st.lists(st.text(max_size=8), max_size=4)),
        "stop_token_ids": st.lists(st.integers(), max_size=4),
        "ignore_eos": st.booleans(),
        "stream": st.booleans(),
    })


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(fields=_sampling_fields(), chat=st.booleans(), text=st.text(min_size=1, max_size=20))
def _serve_one(url, fields, chat, text):
    body = {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}
    r = httpx.post(url + ("/v1/chat/completions" if chat else "/v1/completions"), json={**body, **fields}, timeout=60)
    assert r.status_code in (200, 400), (body, fields, r.status_code, r.text)
    if r.status_code == 400:  # only the context limit may refuse a valid request
        assert r.json()["error"]["code"] in ("context_length_exceeded", "invalid_value"), r.text
    elif fields.get("stream"):
        events = [line for line in r.text.splitlines() if line.startswith("data: ")]
        # an "error" key, not the word: the tiny model may well write "error"
        assert events[-1] == "data: [DONE]" and '"error":' not in r.text, r.text[-500:]


def test_valid_requests_at_extreme_sampling_values_are_served(fuzz_server):
    _serve_one(fuzz_server.url)


def test_server_is_healthy_and_correct_after_fuzzing(fuzz_server):
    assert httpx.get(fuzz_server.url + "/health", timeout=10).status_code == 200
    engine = fuzz_server.engine
    assert engine.dead is None and engine._thread.is_alive()
    r = httpx.post(fuzz_server.url + "/v1/completions", timeout=60,
                   json={"prompt": h.COMPLETION_PROMPTS[0], "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
    want = h.models().tokenizer.decode(h.models().greedy[("completion", h.COMPLETION_PROMPTS[0])][:8])
    assert r.json()["choices"][0]["text"] == want
    wait_for(lambda: engine.load == (0, 0), timeout=10, what="an idle engine")  # rows free after the reply


@pytest.mark.parametrize("fields", [{"top_k": 2**70}, {"top_p": 1e-300, "temperature": 0.7},
                                    {"repetition_penalty": 1.5e-107, "presence_penalty": 1e-38}],
                         ids=["top_k-2**70", "top_p-1e-300", "repetition_penalty-1.5e-107"])
def test_values_that_once_killed_the_engine_are_served(fuzz_server, fields):
    """Regressions, all found by the fuzzing above; each killed the engine thread for every
    client: top_k=2**70 passed validation (ge=-1, no upper bound) and overflowed an int64
    tensor; top_p=1e-300 is 0.0 in float32, so top-p dropped every token and sampling got NaN;
    repetition_penalty=1.5e-107 divided positive logits to +inf, and softmax over +inf is NaN."""
    r = httpx.post(fuzz_server.url + "/v1/completions", timeout=60,
                   json={"prompt": "x", "max_tokens": 4, "seed": 1, **fields})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    assert httpx.get(fuzz_server.url + "/health", timeout=10).status_code == 200


@pytest.mark.parametrize("ids", [[-2199023255551], [2**40], [-1, 3]], ids=["huge-negative", "past-vocab", "minus-one"])
def test_stop_token_ids_outside_the_vocabulary_are_a_400(fuzz_server, ids):
    """Found by the fuzzing above: with min_tokens, stop_token_ids index the logits to block them,
    and an id outside the vocabulary killed the engine thread (IndexError) for every client."""
    r = httpx.post(fuzz_server.url + "/v1/completions", timeout=60,
                   json={"prompt": "x", "max_tokens": 4, "min_tokens": 2, "stop_token_ids": ids})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop_token_ids", r.text
    assert httpx.get(fuzz_server.url + "/health", timeout=10).status_code == 200


def test_the_engine_ignores_stop_ids_it_can_never_emit():
    """Behind the server's check, the engine itself does not index with an id outside the vocabulary."""
    import torch

    from engine.api import SamplingParams
    from engine.logits_processing import LogitsProcessor
    proc = LogitsProcessor(SamplingParams(min_tokens=2, stop_token_ids=[-7, 10**12, 5]), [1, 2], 16, "cpu", [3])
    out = proc.apply(torch.zeros(1, 16), [[]])
    assert torch.isinf(out[0, [3, 5]]).all() and torch.isfinite(out[0, [0, 1, 2, 4]]).all()
