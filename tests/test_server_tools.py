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


MSG = [{"role": "user", "content": "hi"}]
CALL = {"id": "functions.get_weather:0", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
# (id, body fields, param): each a 400 with an OpenAI error body naming `param`
BAD = [
    ("tool-choice-without-tools", {"tool_choice": "required"}, "tool_choice"),
    ("named-choice-without-tools", {"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ("named-choice-unknown-tool", {"tools": th.TOOLS, "tool_choice": {"type": "function",
                                                                       "function": {"name": "get_wether"}}},
     "tool_choice"),
    ("tool-choice-bad-string", {"tools": th.TOOLS, "tool_choice": "always"}, "tool_choice"),
    ("tool-choice-bad-type", {"tools": th.TOOLS, "tool_choice": {"type": "tool", "function": {"name": "get_time"}}},
     "tool_choice"),
    ("auto-without-a-parser", {"tools": th.TOOLS}, "tool_choice"),
    ("tools-not-a-list", {"tools": {"type": "function"}}, "tools"),
    ("tool-without-function", {"tools": [{"type": "function"}]}, "tools[0].function"),
    ("custom-tool", {"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
    ("function-name-invalid", {"tools": [{"type": "function", "function": {"name": "get weather!"}}]},
     "tools[0].function.name"),
    ("function-parameters-not-object", {"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
     "tools[0].function.parameters"),
    ("duplicate-tool-names", {"tools": [th.TIME, th.TIME], "tool_choice": "required"}, "tools"),
    ("parallel-tool-calls-string", {"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ("tool-message-without-id", {"messages": MSG + [{"role": "tool", "content": "22 C"}]}, "messages[1]"),
    ("tool-calls-on-a-user-message", {"messages": [{"role": "user", "content": "hi", "tool_calls": [CALL]}]},
     "messages[0]"),
    ("tool-call-arguments-not-json", {"messages": MSG + [
        {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{city"}}]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "x"}]},
     "messages[1].tool_calls[0].function.arguments"),
    ("functions-deprecated", {"functions": [{"name": "f"}]}, "functions"),
    ("function-call-deprecated", {"function_call": "auto"}, "function_call"),
    ("audio", {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ("modalities-audio", {"modalities": ["text", "audio"]}, "modalities"),
    ("prediction", {"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ("store", {"store": True}, "store"),
    ("metadata", {"metadata": {"k": "v"}}, "metadata"),
    ("service-tier-flex", {"service_tier": "flex"}, "service_tier"),
    ("reasoning-effort", {"reasoning_effort": "high"}, "reasoning_effort"),
    ("verbosity", {"verbosity": "low"}, "verbosity"),
    ("web-search", {"web_search_options": {}}, "web_search_options"),
    ("stream-obfuscation", {"stream": True, "stream_options": {"include_obfuscation": True}},
     "stream_options.include_obfuscation"),
    ("message-audio", {"messages": MSG + [{"role": "assistant", "content": "x", "audio": {"id": "a1"}}]},
     "messages[1].audio"),
    ("required-with-response-format", {"tools": th.TOOLS, "tool_choice": "required",
                                       "response_format": {"type": "json_object"}}, "tool_choice"),
]


@pytest.mark.parametrize("name,fields,param", BAD, ids=[b[0] for b in BAD])
def test_bad_tool_and_unsupported_fields_get_openai_400s(no_parser, name, fields, param):
    import httpx
    body = {"messages": MSG, "max_tokens": 4, **fields}
    r = httpx.post(no_parser.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and err["message"], err


@pytest.mark.parametrize("fields", [
    {"store": False, "metadata": {}, "service_tier": "auto", "modalities": ["text"], "user": "u-1",
     "safety_identifier": "s", "prompt_cache_key": "k", "audio": None, "prediction": None, "best_of": 1},
    {"messages": MSG + [{"role": "assistant", "content": "x", "refusal": None, "audio": None, "function_call": None}]},
    {"tools": th.TOOLS, "tool_choice": "none"},
])
def test_neutral_values_of_unsupported_fields_are_accepted(no_parser, fields):
    import httpx
    r = httpx.post(no_parser.url + "/v1/chat/completions", json={"messages": MSG, "max_tokens": 4, **fields},
                   timeout=60)
    assert r.status_code == 200, r.text


def test_sglang_gets_the_same_grammar_and_keeps_special_tokens():
    """What the SGLang engine is sent for tool_choice required with the Kimi parser: the grammar
    (EBNF, compiled by SGLang's xgrammar backend) and skip_special_tokens false, so that the
    markers reach our parser; auto sends no grammar."""
    import xgrammar as xgr

    from engine.api import SamplingParams
    from server.engines.sglang_engine import to_sglang_sampling
    from server.protocol import ChatCompletionRequest
    from server.tools import apply_tool_plan, plan_tools

    for choice, grammar in (("required", True), ("auto", False)):
        req = ChatCompletionRequest.model_validate({**th.EXAMPLES[0][0], "tool_choice": choice})
        params = SamplingParams()
        apply_tool_plan(plan_tools(req, "kimi_k2", "kimi_k2"), params)
        sent = to_sglang_sampling(params)
        assert sent["skip_special_tokens"] is False
        assert ("ebnf" in sent) == grammar
        if grammar:
            assert "<|tool_calls_section_begin|>" in sent["ebnf"] and "get_weather" in sent["ebnf"]
            xgr.Grammar.from_ebnf(sent["ebnf"])  # it parses back


def test_kimi_ids_count_the_calls_already_in_the_conversation():
    from server.tools import OutputParser
    text = th.section(th.call("get_time", {"zone": "UTC"}, 2))
    (only,) = OutputParser("kimi_k2", None, th.TOOLS, history_calls=2).full(text).tool_calls
    assert only == {"id": "functions.get_time:2", "type": "function",
                    "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}


def test_every_choice_parses_its_own_calls(kimi_spec):
    r = create(kimi_spec, {**th.EXAMPLES[0][0], "n": 2})
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        assert c.finish_reason == "tool_calls" and c.message.tool_calls[0].function.arguments == '{"city": "Paris"}'
    streamed = list(create(kimi_spec, {**th.EXAMPLES[0][0], "n": 2}, stream=True))
    for i in (0, 1):
        mine = [c for c in streamed if c.choices and c.choices[0].index == i]
        assert accumulate(mine)["tool_calls"][0]["arguments"] == '{"city": "Paris"}'
