"""Tool calls and reasoning through the official `openai` client, from a tiny model that really
generates Kimi-K2 text (tests/tool_harness.py), parsed by SGLang's own parsers: `tool_calls`
and `reasoning_content` in the message, the same streamed as OpenAI deltas (client-side
accumulation equals the non-streamed answer), finish_reason "tool_calls", with speculation
equal to without; tool_choice required / named met by a grammar (the model's own format with a
parser, a JSON array of calls without one); parser names checked at start-up."""
from __future__ import annotations

import json
import subprocess
import sys

import openai
import pytest

from tests import tool_harness as th

MAX_TOKENS = 120


@pytest.fixture(scope="module")
def kimi_plain():
    srv = th.tool_server(speculative=False)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def kimi_spec():
    srv = th.tool_server(speculative=True)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def no_parser():
    srv = th.tool_server(speculative=True, parsers=False)
    yield srv
    srv.stop()


def create(server, body: dict, stream: bool = False):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    return client.chat.completions.create(model=server.model, temperature=0, max_tokens=MAX_TOKENS, stream=stream,
                                          **body)


def message_of(r) -> dict:
    """A non-streamed answer, normalised."""
    c = r.choices[0]
    m = c.message
    calls = [{"id": t.id, "type": t.type, "name": t.function.name, "arguments": t.function.arguments}
             for t in m.tool_calls or []]
    return {"content": m.content or None, "reasoning": (m.model_extra or {}).get("reasoning_content"),
            "tool_calls": calls, "finish_reason": c.finish_reason}


def accumulate(chunks) -> dict:
    """What a client builds from the stream's deltas; checks the OpenAI delta shape on the way."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in chunks:
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        for tc in d.tool_calls or []:
            if tc.index not in calls:  # a call starts: id, type and name come first, with it
                assert tc.id and tc.type == "function" and tc.function.name, tc
                calls[tc.index] = {"id": tc.id, "type": tc.type, "name": tc.function.name, "arguments": ""}
            else:
                assert tc.id is None and not tc.function.name, tc
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert list(calls) == list(range(len(calls)))
    return {"content": content or None, "reasoning": reasoning or None, "tool_calls": list(calls.values()),
            "finish_reason": finish}


def both_ways(server, body: dict) -> dict:
    full = message_of(create(server, body))
    streamed = accumulate(create(server, body, stream=True))
    assert streamed == full
    return full


def both_ways_ignoring_ids(server, body):
    full, streamed = message_of(create(server, body)), accumulate(create(server, body, stream=True))
    for a in (full, streamed):
        for c in a["tool_calls"]:
            assert c.pop("id").startswith("call_")  # random ids without Kimi's numbering
    assert full == streamed
    return full


def test_kimi_tool_call_parsed_streamed_and_lossless(kimi_plain, kimi_spec):
    body, _ = th.EXAMPLES[0]
    answers = [both_ways(s, body) for s in (kimi_plain, kimi_spec)]
    assert answers[0] == answers[1]
    assert answers[0] == {"content": None, "reasoning": "The user wants the weather, so I call the tool.",
                          "tool_calls": [{"id": "functions.get_weather:0", "type": "function", "name": "get_weather",
                                          "arguments": '{"city": "Paris"}'}],
                          "finish_reason": "tool_calls"}


def test_parallel_calls_with_text_before_them(kimi_plain, kimi_spec):
    body, _ = th.EXAMPLES[1]
    a = both_ways(kimi_spec, body)
    assert a == both_ways(kimi_plain, body)
    assert a["content"] == "Checking both." and a["reasoning"] == "Two calls." and a["finish_reason"] == "tool_calls"
    assert [(c["id"], c["name"], json.loads(c["arguments"])) for c in a["tool_calls"]] == [
        ("functions.get_weather:0", "get_weather", {"city": "Rome"}), ("functions.get_time:1", "get_time",
                                                                       {"zone": "Asia/Tokyo"})]


@pytest.mark.parametrize("example,content,reasoning", [
    (2, "Hello there!", "No tool is needed here."),            # tools offered, none called
    (3, "It is 22 C and sunny in Paris.", "The tool answered."),  # a tool result in the conversation
    (4, "Hello!", "Greet the user."),                           # no tools: reasoning alone
])
def test_answers_without_a_call_keep_reasoning_apart(kimi_plain, kimi_spec, example, content, reasoning):
    body, _ = th.EXAMPLES[example]
    a = both_ways(kimi_spec, body)
    assert a == both_ways(kimi_plain, body)
    assert a == {"content": content, "reasoning": reasoning, "tool_calls": [], "finish_reason": "stop"}


def test_tool_choice_none_does_not_render_or_parse_tools(kimi_spec):
    """tool_choice none: the template gets no tools (the prompt is example 4's)."""
    body = {"messages": [{"role": "user", "content": "Say hello."}], "tools": th.TOOLS, "tool_choice": "none"}
    assert both_ways(kimi_spec, body)["content"] == "Hello!"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_required_and_named_choice_use_the_models_own_format_under_a_grammar(kimi_plain, kimi_spec, choice):
    body = {**th.EXAMPLES[0][0], "tool_choice": choice}
    a = both_ways(kimi_spec, body)
    assert a == both_ways(kimi_plain, body)
    assert [c["name"] for c in a["tool_calls"]] == ["get_weather"] and a["finish_reason"] == "tool_calls"
    assert json.loads(a["tool_calls"][0]["arguments"]) == {"city": "Paris"}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_without_a_tool_format_required_and_named_become_a_json_grammar(no_parser, choice):
    body = {**th.EXAMPLES[0][0], "tool_choice": choice, "parallel_tool_calls": False}
    a = both_ways_ignoring_ids(no_parser, body)
    assert a["finish_reason"] == "tool_calls" and a["content"] is None and a["reasoning"] is None
    (only,) = a["tool_calls"]
    if isinstance(choice, dict):
        assert only["name"] == "get_weather"
    args = json.loads(only["arguments"])
    assert only["name"] in ("get_weather", "get_time") and isinstance(args, dict)
    if only["name"] == "get_weather":
        assert args["city"] in ("Paris", "Rome", "Tokyo")  # the schema's enum: the grammar held


def test_without_a_parser_auto_is_refused(no_parser):
    with pytest.raises(openai.BadRequestError) as e:
        create(no_parser, th.EXAMPLES[0][0])
    assert e.value.body["param"] == "tool_choice" and "tool-call parser" in e.value.body["message"]


def test_bad_parser_names_stop_the_start():
    from server.app import create_app
    from server.tools import ParserSetupError

    with pytest.raises(ParserSetupError, match="tool_call_parser 'kimi' is not one of SGLang's parsers: .*kimi_k2"):
        create_app(object(), tool_call_parser="kimi")
    with pytest.raises(ParserSetupError, match="reasoning_parser 'nope'"):
        create_app(object(), reasoning_parser="nope")
    r = subprocess.run([sys.executable, "-m", "server", "--model", str(th.tool_model()[0]), "--tool-call-parser",
                        "hermez"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "tool_call_parser 'hermez' is not one of SGLang's parsers" in r.stderr
    r = subprocess.run([sys.executable, "-m", "launch.cli", "--profile", "reference", "--reasoning-parser", "r2",
                        "--dry-run"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "server.reasoning_parser 'r2' is not one of SGLang's parsers" in r.stderr, r.stderr


def test_reference_profile_parses_kimi_k2():
    r = subprocess.run([sys.executable, "-m", "launch.cli", "--profile", "reference", "--dry-run"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "parsers: tool calls kimi_k2, reasoning kimi_k2" in r.stdout


def test_stream_and_message_shapes_over_raw_http(kimi_spec):
    """The raw bodies: a message with a call has content null and no reasoning key when none."""
    import httpx
    def message(example: int) -> dict:
        body = {"model": kimi_spec.model, "max_tokens": MAX_TOKENS, "temperature": 0, **th.EXAMPLES[example][0]}
        return httpx.post(kimi_spec.url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]
    msg = message(0)
    assert msg["content"] is None and msg["tool_calls"][0]["function"]["name"] == "get_weather"
    assert set(msg) == {"role", "content", "reasoning_content", "tool_calls"}
    msg = message(4)
    assert msg == {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet the user."}


def test_unparsed_server_keeps_plain_text(no_parser):
    """Without a reasoning parser the thinking stays in the content, as the model wrote it."""
    a = message_of(create(no_parser, th.EXAMPLES[4][0]))
    assert a == {"content": "<think>Greet the user.</think>Hello!", "reasoning": None, "tool_calls": [],
                 "finish_reason": "stop"}
