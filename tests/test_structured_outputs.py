"""Structured outputs (xgrammar) through the official `openai` client: every output is valid for
its constraint (JSON schema, json_object, regex, choice, EBNF grammar; `chat.completions.parse`
with a pydantic model), greedy output is the same with speculation and without, streamed and
not; a schema xgrammar cannot compile is a 400 with its message; a grammar that compiles too
slowly is refused on time while other requests keep streaming."""
from __future__ import annotations

import json
import re
import threading
import time
from typing import Annotated, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from tests import server_harness as h

MAX_TOKENS = 60
# Bounded fields, so that the tiny random model must finish the object within MAX_TOKENS.
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "pet": {"enum": ["cat", "dog", "fish"]},
    "ok": {"type": "boolean"}}, "required": ["name", "age", "pet", "ok"], "additionalProperties": False}


class Person(BaseModel):
    """PERSON as a pydantic model: validates the outputs, and is what `parse` sends."""
    model_config = ConfigDict(extra="forbid", strict=True)
    name: Annotated[str, Field(max_length=8)]
    age: Annotated[int, Field(ge=0, le=120)]
    pet: Literal["cat", "dog", "fish"]
    ok: bool


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat(server, prompt: str, stream: bool = False, **kw) -> tuple[str, str]:
    """(text, finish_reason), streamed or not."""
    r = client(server).chat.completions.create(model=server.model, messages=[{"role": "user", "content": prompt}],
                                               stream=stream, **{"temperature": 0, "max_tokens": MAX_TOKENS, **kw})
    if not stream:
        return r.choices[0].message.content, r.choices[0].finish_reason
    chunks = [c for c in r if c.choices]
    return "".join(c.choices[0].delta.content or "" for c in chunks), chunks[-1].choices[0].finish_reason


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}


def test_json_schema_output_is_valid_and_speculation_changes_nothing(plain, spec):
    for prompt in h.CHAT_PROMPTS:
        outs = {(name, stream): chat(server, prompt, stream, response_format=schema_format(PERSON))
                for name, server in (("plain", plain), ("spec", spec)) for stream in (False, True)}
        assert len(set(outs.values())) == 1, outs
        text, finish = outs[("plain", False)]
        assert finish == "stop"
        Person.model_validate_json(text)


def test_parse_with_a_pydantic_model(plain, spec):
    for server in (plain, spec):
        r = client(server).chat.completions.parse(
            model=server.model, messages=[{"role": "user", "content": h.CHAT_PROMPTS[1]}], temperature=0,
            max_tokens=MAX_TOKENS, response_format=Person)
        person = r.choices[0].message.parsed
        assert isinstance(person, Person) and 0 <= person.age <= 120 and person.pet in ("cat", "dog", "fish")
    assert (client(plain).chat.completions.parse(model=plain.model, response_format=Person, temperature=0,
                                                 max_tokens=MAX_TOKENS,
                                                 messages=[{"role": "user", "content": h.CHAT_PROMPTS[1]}])
            .choices[0].message.content == r.choices[0].message.content)


def test_json_object_is_an_object(plain, spec):
    for prompt in h.CHAT_PROMPTS[:2]:
        a = chat(plain, prompt, response_format={"type": "json_object"}, max_tokens=24)
        assert a == chat(spec, prompt, response_format={"type": "json_object"}, max_tokens=24)
        assert a[0].startswith("{")
        if a[1] == "stop":
            assert isinstance(json.loads(a[0]), dict)


@pytest.mark.parametrize("kind,value,check", [
    ("regex", r"(yes|no), [0-9]{2,4}\.", lambda t: re.fullmatch(r"(yes|no), [0-9]{2,4}\.", t)),
    ("choice", ["red", "green", "blue"], lambda t: t in ("red", "green", "blue")),
    ("grammar", 'root ::= "x=" [0-9] [0-9]? ";"', lambda t: re.fullmatch(r"x=[0-9][0-9]?;", t)),
    ("json", PERSON, lambda t: Person.model_validate_json(t)),
])
def test_vllm_structured_outputs_completions(plain, spec, kind, value, check):
    """vLLM's `structured_outputs` extra on /v1/completions, streamed and not."""
    outs = set()
    for server in (plain, spec):
        for stream in (False, True):
            r = client(server).completions.create(model=server.model, prompt=h.COMPLETION_PROMPTS[2], temperature=0,
                                                  max_tokens=MAX_TOKENS, stream=stream,
                                                  extra_body={"structured_outputs": {kind: value}})
            if stream:
                chunks = [c for c in r if c.choices]
                outs.add(("".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason))
            else:
                outs.add((r.choices[0].text, r.choices[0].finish_reason))
    assert len(outs) == 1, outs
    text, finish = outs.pop()
    assert finish == "stop" and check(text), text


def test_sampled_json_is_valid(spec):
    """Sampling under a grammar (speculative rejection sampling against the masked target, from
    masked drafts) still gives valid output."""
    for seed in range(3):
        text, finish = chat(spec, h.CHAT_PROMPTS[0], response_format=schema_format(PERSON), temperature=1.0,
                            seed=seed)
        assert finish == "stop"
        Person.model_validate_json(text)


def test_schema_that_does_not_compile_is_a_400(spec):
    for body in ({"response_format": schema_format({"type": "frobnicate"})},
                 {"structured_outputs": {"regex": "(unclosed"}},
                 {"structured_outputs": {"grammar": "root ::= missing_rule"}}):
        for stream in (False, True):
            r = httpx.post(spec.url + "/v1/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream, **body})
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error" and err["code"] == "invalid_value"
            assert err["param"] in ("response_format", "structured_outputs") and len(err["message"]) > 20


@pytest.fixture(scope="module")
def impatient():
    """A plain server that gives a grammar 0.3 s to compile."""
    srv = h.start_server(h.native_engine(h.models(), speculative=False, grammar_timeout_s=0.3))
    yield srv
    srv.stop()


def test_slow_grammar_is_refused_on_time_while_others_stream(impatient):
    """An enum of 12,000 values takes xgrammar seconds to compile: the request gets a 400 at the
    time limit, and a request streaming meanwhile is not held up by the compile."""
    slow = {"type": "json_schema", "json_schema": {"name": "big", "schema": {
        "enum": [f"v{i}_{time.time_ns()}" for i in range(12000)]}}}
    gaps, done = [], threading.Event()

    def stream_other():
        last = time.monotonic()
        for _ in client(impatient).completions.create(model=impatient.model, prompt="def f():", temperature=0,
                                                       max_tokens=200, stream=True, extra_body={"ignore_eos": True}):
            now = time.monotonic()
            gaps.append(now - last)
            last = now
        done.set()
    t = threading.Thread(target=stream_other)
    t.start()
    while not gaps:
        time.sleep(0.01)
    t0 = time.monotonic()
    r = httpx.post(impatient.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "response_format": slow})
    waited = time.monotonic() - t0
    t.join(120)
    assert r.status_code == 400 and "did not compile within 0.3 s" in r.json()["error"]["message"], r.text
    assert waited < 3.0
    # chunks, not tokens: a busy machine coalesces several tokens into one chunk
    assert done.is_set() and len(gaps) > 10 and max(gaps[1:]) < 2.0
