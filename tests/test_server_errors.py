"""Bad requests get the documented 4xx with an OpenAI error body, and the server keeps serving;
the API key guards /v1/* only (constant-time Bearer check, never from the query string);
/health follows the engine (503 while loading, 200 ready, 503 when it failed); request ids
are honoured or made, and each request leaves one access-log line."""
from __future__ import annotations

import json
import logging
import threading
import time

import httpx
import openai
import pytest

from tests import server_harness as h

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


def chat_body(**kw):
    return json.dumps({"messages": MSG, "max_tokens": 4, **kw})


def comp_body(**kw):
    return json.dumps({"prompt": "def f():", "max_tokens": 4, **kw})


def chunked(total: int):
    def gen():
        sent = 0
        while sent < total:
            yield b" " * 65536
            sent += 65536
    return gen()


# (id, method, path, body (bytes | str | callable -> content), status, error code, param)
BAD = [
    ("malformed-json", "POST", CHAT, '{"messages": [', 400, "invalid_json", None),
    ("invalid-utf8", "POST", CHAT, b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, "invalid_body",
     None),
    ("empty-body", "POST", CHAT, b"", 400, "invalid_json", None),
    ("json-array-body", "POST", CHAT, "[1, 2]", 400, "invalid_json", None),
    ("nan-literal", "POST", CHAT, '{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400,
     "invalid_value", "temperature"),
    ("messages-missing", "POST", CHAT, '{"max_tokens": 4}', 400, "invalid_value", "messages"),
    ("messages-empty", "POST", CHAT, chat_body(messages=[]), 400, "invalid_value", "messages"),
    ("messages-not-a-list", "POST", CHAT, chat_body(messages="hi"), 400, "invalid_value", "messages"),
    ("unknown-role", "POST", CHAT, chat_body(messages=[{"role": "wizard", "content": "hi"}]), 400, "invalid_value",
     "messages[0].role"),
    ("content-wrong-type", "POST", CHAT, chat_body(messages=[{"role": "user", "content": 5}]), 400, "invalid_value",
     "messages[0].content"),
    ("image-content-part", "POST", CHAT, chat_body(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]), 400, "invalid_value", "messages[0].content"),
    ("user-without-content", "POST", CHAT, chat_body(messages=[{"role": "user"}]), 400, "invalid_value", "messages[0]"),
    ("max-tokens-negative", "POST", CHAT, chat_body(max_tokens=-1), 400, "invalid_value", "max_tokens"),
    ("max-tokens-zero", "POST", COMP, comp_body(max_tokens=0), 400, "invalid_value", "max_tokens"),
    ("max-tokens-string", "POST", COMP, comp_body(max_tokens="10"), 400, "invalid_value", "max_tokens"),
    ("max-tokens-float", "POST", COMP, comp_body(max_tokens=2.5), 400, "invalid_value", "max_tokens"),
    ("integer-too-long", "POST", COMP, '{"prompt": "x", "max_tokens": 1' + "0" * 5000 + "}", 400, "invalid_json", None),
    ("deeply-nested", "POST", COMP, '{"prompt": ' + "[" * 100000 + "]" * 100000 + "}", 400, "invalid_json", None),
    ("max-tokens-huge", "POST", CHAT, chat_body(max_tokens=10**12), 400, "context_length_exceeded", "max_tokens"),
    ("max-completion-tokens-huge", "POST", CHAT, chat_body(max_completion_tokens=100000), 400,
     "context_length_exceeded", "max_completion_tokens"),
    ("temperature-negative", "POST", CHAT, chat_body(temperature=-0.5), 400, "invalid_value", "temperature"),
    ("top-p-zero", "POST", COMP, comp_body(top_p=0), 400, "invalid_value", "top_p"),
    ("top-p-above-one", "POST", COMP, comp_body(top_p=1.5), 400, "invalid_value", "top_p"),
    ("best-of-2", "POST", COMP, comp_body(best_of=2), 400, "invalid_value", "best_of"),
    ("best-of-true", "POST", CHAT, chat_body(best_of=True), 400, "invalid_value", "best_of"),  # not 1: JSON types
    ("store-zero", "POST", CHAT, chat_body(store=0), 400, "invalid_value", "store"),
    ("suffix", "POST", COMP, comp_body(suffix="x"), 400, "invalid_value", "suffix"),
    ("top-k-below-minus-one", "POST", COMP, comp_body(top_k=-5), 400, "invalid_value", "top_k"),
    ("seed-out-of-range", "POST", COMP, comp_body(seed=2**70), 400, "invalid_value", "seed"),
    # logprobs, n, penalties, logit_bias, structured outputs
    ("n-too-large", "POST", CHAT, chat_body(n=17), 400, "invalid_value", "n"),
    ("n-zero", "POST", COMP, comp_body(n=0), 400, "invalid_value", "n"),
    ("top-logprobs-over-20", "POST", CHAT, chat_body(logprobs=True, top_logprobs=21), 400, "invalid_value",
     "top_logprobs"),
    ("top-logprobs-without-logprobs", "POST", CHAT, chat_body(top_logprobs=3), 400, "invalid_value", "top_logprobs"),
    ("chat-logprobs-not-bool", "POST", CHAT, chat_body(logprobs=3), 400, "invalid_value", "logprobs"),
    ("completion-logprobs-over-5", "POST", COMP, comp_body(logprobs=6), 400, "invalid_value", "logprobs"),
    ("completion-logprobs-negative", "POST", COMP, comp_body(logprobs=-1), 400, "invalid_value", "logprobs"),
    ("frequency-penalty-out-of-range", "POST", COMP, comp_body(frequency_penalty=2.5), 400, "invalid_value",
     "frequency_penalty"),
    ("presence-penalty-out-of-range", "POST", CHAT, chat_body(presence_penalty=-3), 400, "invalid_value",
     "presence_penalty"),
    ("repetition-penalty-zero", "POST", COMP, comp_body(repetition_penalty=0), 400, "invalid_value",
     "repetition_penalty"),
    ("min-tokens-negative", "POST", COMP, comp_body(min_tokens=-1), 400, "invalid_value", "min_tokens"),
    ("min-tokens-over-max-tokens", "POST", COMP, comp_body(min_tokens=10), 400, "invalid_value", None),
    ("logit-bias-outside-vocab", "POST", CHAT, chat_body(logit_bias={"999999": 1}), 400, "invalid_value",
     "logit_bias"),
    ("logit-bias-out-of-range", "POST", COMP, comp_body(logit_bias={"5": 150}), 400, "invalid_value", "logit_bias"),
    ("logit-bias-not-a-token-id", "POST", COMP, comp_body(logit_bias={"hello": 1}), 400, "invalid_value",
     "logit_bias"),
    ("response-format-unknown-type", "POST", CHAT, chat_body(response_format={"type": "xml"}), 400, "invalid_value",
     "response_format.type"),
    ("json-schema-missing", "POST", CHAT, chat_body(response_format={"type": "json_schema"}), 400, "invalid_value",
     "response_format"),
    ("json-schema-invalid", "POST", CHAT, chat_body(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "frobnicate"}}}), 400, "invalid_value", "response_format"),
    ("json-schema-bad-ref", "POST", CHAT, chat_body(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"$ref": "#/$defs/missing"}}}), 400, "invalid_value", "response_format"),
    ("regex-unclosed", "POST", COMP, comp_body(structured_outputs={"regex": "(ab"}), 400, "invalid_value",
     "structured_outputs"),
    ("grammar-undefined-rule", "POST", COMP, comp_body(structured_outputs={"grammar": "root ::= nothing"}), 400,
     "invalid_value", "structured_outputs"),
    ("structured-two-kinds", "POST", COMP, comp_body(structured_outputs={"regex": "a", "choice": ["b"]}), 400,
     "invalid_value", "structured_outputs"),
    ("choice-empty", "POST", COMP, comp_body(structured_outputs={"choice": []}), 400, "invalid_value",
     "structured_outputs.choice"),
    ("format-and-structured", "POST", CHAT, chat_body(response_format={"type": "json_object"},
                                                      structured_outputs={"regex": "a"}), 400, "invalid_value", None),
    ("min-tokens-with-grammar", "POST", CHAT, chat_body(min_tokens=2, response_format={"type": "json_object"}), 400,
     "invalid_value", None),
    ("guided-json-retired", "POST", COMP, comp_body(guided_json={"type": "object"}), 400, "invalid_value",
     "guided_json"),
    ("guided-choice-retired", "POST", CHAT, chat_body(guided_choice=["a", "b"]), 400, "invalid_value",
     "guided_choice"),
    ("echo-with-logprobs", "POST", COMP, comp_body(echo=True, logprobs=1), 400, "invalid_value", None),
    ("stop-wrong-type", "POST", COMP, comp_body(stop=5), 400, "invalid_value", "stop"),
    ("stop-token-ids-strings", "POST", COMP, comp_body(stop_token_ids=["a"]), 400, "invalid_value",
     "stop_token_ids[0]"),
    ("ignore-eos-string", "POST", COMP, comp_body(ignore_eos="yes"), 400, "invalid_value", "ignore_eos"),
    ("stream-options-without-stream", "POST", CHAT, chat_body(stream_options={"include_usage": True}), 400,
     "invalid_value", "stream_options"),
    ("prompt-missing", "POST", COMP, '{"max_tokens": 4}', 400, "invalid_value", "prompt"),
    ("prompt-empty", "POST", COMP, comp_body(prompt=""), 400, "invalid_value", "prompt"),
    ("prompt-batch", "POST", COMP, comp_body(prompt=["a", "b"]), 400, "invalid_value", "prompt"),
    ("prompt-token-out-of-vocab", "POST", COMP, comp_body(prompt=[1, 2, 10**6]), 400, "invalid_value", "prompt"),
    ("prompt-token-negative", "POST", COMP, comp_body(prompt=[5, -1]), 400, "invalid_value", "prompt"),
    ("prompt-over-context", "POST", COMP, comp_body(prompt=[7] * 600), 400, "context_length_exceeded", "prompt"),
    ("chat-over-context", "POST", CHAT, chat_body(messages=[{"role": "user", "content": "word " * 2000}]), 400,
     "context_length_exceeded", "messages"),
    ("lone-surrogate", "POST", COMP, '{"prompt": "a\\ud800b", "max_tokens": 4}', 400, "invalid_value", "prompt"),
    ("unknown-model", "POST", CHAT, chat_body(model="gpt-17"), 404, "model_not_found", "model"),
    ("unknown-route", "POST", "/v1/edits", chat_body(), 404, "not_found", None),
    ("wrong-method", "GET", CHAT, None, 405, "method_not_allowed", None),
    ("oversized-body", "POST", CHAT, lambda: json.dumps({"messages": MSG, "pad": "x" * (h.MAX_BODY_BYTES + 10)}),
     413, "body_too_large", None),
    ("oversized-chunked-body", "POST", COMP, lambda: chunked(h.MAX_BODY_BYTES + 65536), 413, "body_too_large", None),
]


@pytest.mark.parametrize("name,method,path,content,status,code,param", BAD, ids=[b[0] for b in BAD])
def test_bad_request_gets_documented_status_and_openai_error(spec, name, method, path, content, status, code, param):
    content = content() if callable(content) else content
    r = httpx.request(method, spec.url + path, content=content, timeout=30,
                      headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["code"] == code
    if param is not None:
        assert err["param"] == param
    assert r.headers["x-request-id"]


def test_unknown_fields_are_ignored(spec):
    r = httpx.post(spec.url + CHAT, content=chat_body(user="u1", frobnicate={"a": 1}, parallel_tool_calls=False),
                   timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.post(spec.url + COMP, content=comp_body(user="u1", best_of=1, suffix="", frobnicate=1), timeout=30)
    assert r.status_code == 200, r.text  # unoffered fields at their neutral values


def test_still_serves_after_bad_requests(spec):
    for name, method, path, content, *_ in BAD[:10]:
        httpx.request(method, spec.url + path, content=content() if callable(content) else content, timeout=30)
    r = httpx.post(spec.url + COMP, json={"model": spec.model, "prompt": "def f():", "max_tokens": 4,
                                          "temperature": 0}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    assert httpx.get(spec.url + "/health", timeout=10).status_code == 200


@pytest.fixture(scope="module")
def keyed():
    srv = h.start_server(h.native_engine(h.models(), speculative=False), api_key=h.API_KEY)
    yield srv
    srv.stop()


def test_api_key_required_on_v1_only(keyed):
    url = keyed.url
    for headers in ({}, {"authorization": "Bearer wrong-key"}, {"authorization": h.API_KEY},
                    {"authorization": f"Basic {h.API_KEY}"}):
        r = httpx.post(url + COMP, content=comp_body(), headers=headers, timeout=30)
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(url + f"/v1/models?api_key={h.API_KEY}", timeout=10).status_code == 401
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    assert httpx.get(url + "/metrics", timeout=10).status_code == 200
    good = openai.OpenAI(base_url=url + "/v1", api_key=h.API_KEY, max_retries=0)
    r = good.completions.create(model=keyed.model, prompt="x", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="nope", max_retries=0).models.list()


def test_health_follows_the_engine_loading_ready_and_failed():
    models = h.models()
    gate = threading.Event()
    engine = h.native_engine(models, speculative=False)
    real_load = engine._load_fn
    engine._load_fn = lambda: (gate.wait(30), real_load())[1]  # the real loader, held until we let it go
    srv = h.start_server(engine, wait=False)
    r = httpx.get(srv.url + "/health", timeout=10)
    assert (r.status_code, r.json()["status"], r.headers["retry-after"]) == (503, "loading", "5")
    r = httpx.post(srv.url + COMP, content=comp_body(), timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_loading" and r.headers["retry-after"]
    gate.set()
    srv.wait_healthy()
    assert httpx.post(srv.url + COMP, content=comp_body(), timeout=30).status_code == 200

    broken = h.native_engine(models, speculative=False)
    broken._load_fn = lambda: (_ for _ in ()).throw(FileNotFoundError("no weights here"))
    bad = h.start_server(broken, wait=False)
    deadline = time.monotonic() + 10
    while (r := httpx.get(bad.url + "/health", timeout=10)).json()["status"] == "loading":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert r.status_code == 503 and r.json()["status"] == "dead" and "no weights here" in r.json()["error"]
    r = httpx.post(bad.url + COMP, content=comp_body(), timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"


def test_request_ids_and_access_log(spec, caplog):
    caplog.set_level(logging.INFO, logger="specserve.access")
    r = httpx.post(spec.url + COMP, content=comp_body(temperature=0), headers={"x-request-id": "trace-42.a"},
                   timeout=30)
    assert r.headers["x-request-id"] == "trace-42.a" and r.json()["id"] == "cmpl-trace-42.a"
    r2 = httpx.post(spec.url + COMP, content=comp_body(temperature=0), headers={"x-request-id": "bad id\twith spaces"},
                    timeout=30)
    rid = r2.headers["x-request-id"]
    assert rid != "bad id\twith spaces" and r2.json()["id"] == f"cmpl-{rid}"
    assert httpx.post(spec.url + COMP, content=comp_body(), timeout=30).headers["x-request-id"] != rid
    time.sleep(0.1)  # the access line is written when the response has been sent
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "specserve.access"]
    line = next(line for line in lines if "[trace-42.a]" in line)
    usage = r.json()["usage"]
    assert '"POST /v1/completions HTTP/1.1" 200' in line
    assert f"prompt_tokens={usage['prompt_tokens']} completion_tokens=4" in line
    assert f"accept_length={usage['spec_decoding']['accept_length']:.2f}" in line and "latency_ms=" in line
