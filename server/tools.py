"""Tool calls and reasoning in model output, with SGLang's own parsers.

`FunctionCallParser` (sglang.srt.function_call: kimi_k2, hermes, qwen25, llama3, ...) turns a
model's tool-call text into calls; `ReasoningParser` (sglang.srt.parser: kimi_k2, deepseek-r1,
qwen3, ...) splits the thinking from the answer. The names are server settings (profile
`[server] tool_call_parser / reasoning_parser`, `--tool-call-parser / --reasoning-parser`),
checked at start-up against SGLang's tables.

The parsing happens here, in our server, for every engine (native, SGLang and vLLM) alike:
our SGLang adapter drives `sglang.Engine.async_generate`, which returns raw text; SGLang parses
in its own HTTP layer, which we do not run. One place, the same classes SGLang's server uses, so
every engine gives the same answer for the same text. SGLang gets no parser names for the same
reason: a tool_choice grammar (required / a named function) is built here, thinking included
where the model reasons, and reaches any engine as an engine.api.Constraint.

Order, as in SGLang's serving_chat: the reasoning parser sees the text first; what it leaves
as the answer goes to the tool-call parser. Streaming feeds both parsers each delta; a tail
that may be the start of a tool-call marker is held back until the next delta, because
SGLang's detectors expect every marker in one piece (one token in SGLang) and our deltas can
cut one (stop-string hold-back).
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field


class ParserSetupError(ValueError):
    """A parser name is unknown, or SGLang's parsers cannot be imported."""


_MISSING = ("tool-call and reasoning parsers come from SGLang: pip install --no-deps sglang==0.5.23 and "
            "pip install partial-json-parser ({})")


def _tables() -> tuple[dict, dict]:
    try:
        from sglang.srt.function_call.function_call_parser import FunctionCallParser
        from sglang.srt.parser.reasoning_parser import ReasoningParser
    except ImportError as e:
        raise ParserSetupError(_MISSING.format(e)) from None
    return FunctionCallParser.ToolCallParserEnum, ReasoningParser.DetectorMap


def check_parser_names(tool_call_parser: str | None, reasoning_parser: str | None) -> None:
    """Raise ParserSetupError naming the setting and SGLang's choices if a name is unknown."""
    if not tool_call_parser and not reasoning_parser:
        return
    tools, reasoning = _tables()
    for setting, name, table in (("tool_call_parser", tool_call_parser, tools),
                                 ("reasoning_parser", reasoning_parser, reasoning)):
        if name and name not in table:
            raise ParserSetupError(f"{setting} {name!r} is not one of SGLang's parsers: {', '.join(sorted(table))}")


def tool_call_id(parser_name: str | None, name: str, index: int) -> str:
    """Kimi-K2 ids carry the function and the call's number in the conversation (its chat
    template renders them back as-is); other formats get a random id, as in SGLang."""
    if parser_name == "kimi_k2":
        return f"functions.{name}:{index}"
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ParsedOutput:
    """A whole message, or one stream delta's part of it. `tool_calls` are OpenAI dicts: whole
    calls in a message; in a delta, {index, id, type, function: {name, arguments}} when a call
    starts and {index, function: {arguments}} for later argument fragments."""
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


class OutputParser:
    """One request's output parsing. `tools`: the request's tools as OpenAI dicts, None when
    tool calls are not parsed (no parser, no tools, tool_choice none). `history_calls`: tool
    calls already in the conversation (Kimi-K2 numbers calls across it)."""

    def __init__(self, tool_call_parser: str | None, reasoning_parser: str | None, tools: list[dict] | None,
                 history_calls: int = 0):
        from sglang.srt.entrypoints.openai.protocol import Tool
        from sglang.srt.function_call.function_call_parser import FunctionCallParser
        from sglang.srt.parser.reasoning_parser import ReasoningParser

        self.parser_name, self.history_calls = tool_call_parser, history_calls
        self._tools = [Tool.model_validate(t) for t in tools] if tool_call_parser and tools else None
        self._new_tool_parser = lambda: FunctionCallParser(self._tools, tool_call_parser)
        self._new_reasoning_parser = (lambda: ReasoningParser(reasoning_parser)) if reasoning_parser else None
        self._stream_tools = self._new_tool_parser() if self._tools else None
        self._stream_reasoning = self._new_reasoning_parser() if self._new_reasoning_parser else None
        self._markers = _markers(self._stream_tools) if self._stream_tools else ()
        self._held = ""
        self._ids: dict[int, str] = {}

    @property
    def called(self) -> bool:
        """Whether the stream so far made a tool call."""
        return bool(self._ids)

    def full(self, text: str) -> ParsedOutput:
        reasoning = ""
        if self._new_reasoning_parser:
            reasoning, text = self._new_reasoning_parser().parse_non_stream(text)
            reasoning, text = reasoning or "", text or ""
        calls = []
        if self._tools:
            parser = self._new_tool_parser()
            if parser.has_tool_call(text):
                text, items = parser.parse_non_stream(text)
                calls = [self._call(i, item.name, item.parameters) for i, item in enumerate(items)]
        return ParsedOutput(content=text, reasoning=reasoning, tool_calls=calls)

    def delta(self, text: str, final: bool) -> ParsedOutput:
        """The next delta's parts; `final` flushes what the parsers hold back."""
        out = ParsedOutput()
        if self._stream_reasoning:
            reasoning, text = self._stream_reasoning.parse_stream_chunk(text)
            out.reasoning, text = reasoning or "", text or ""
            if final:
                end_reasoning, end_text = self._stream_reasoning.parse_stream_end()
                out.reasoning += end_reasoning or ""
                text += end_text or ""
        if not self._stream_tools:
            out.content = text
            return out
        text, self._held = self._split_held(self._held + text, final)
        items = []
        if text:
            out.content, items = self._stream_tools.parse_stream_chunk(text)
        if final:
            end_text, end_items = self._stream_tools.parse_stream_end()
            out.content += end_text or ""
            items = items + end_items
        out.tool_calls = self._call_deltas(items)
        return out

    def _split_held(self, text: str, final: bool) -> tuple[str, str]:
        if final:
            return text, ""
        for n in range(min(len(text), max((len(m) for m in self._markers), default=1) - 1), 0, -1):
            if any(m.startswith(text[-n:]) for m in self._markers):
                return text[:-n], text[-n:]
        return text, ""

    def _call(self, index: int, name: str, arguments: str) -> dict:
        return {"id": tool_call_id(self.parser_name, name, self.history_calls + index), "type": "function",
                "function": {"name": name, "arguments": arguments}}

    def _call_deltas(self, items) -> list[dict]:
        """SGLang's ToolCallItems -> OpenAI delta tool_calls, one entry per call per delta."""
        deltas: list[dict] = []
        for item in items:
            i = item.tool_index
            if deltas and deltas[-1]["index"] == i:
                deltas[-1]["function"]["arguments"] += item.parameters or ""
            elif item.name and i not in self._ids:
                call = self._call(i, item.name, item.parameters or "")
                self._ids[i] = call["id"]
                deltas.append({"index": i, **call})
            elif item.parameters:
                deltas.append({"index": i, "function": {"arguments": item.parameters}})
        return deltas


def _markers(tool_parser) -> tuple[str, ...]:
    """The tool-call markers of a detector (bot_token, tool_call_end_token, ...)."""
    d = tool_parser.detector
    return tuple(v for k, v in vars(d).items() if k.endswith("_token") and isinstance(v, str) and len(v) > 1)


def required_call_schema(tools: list[dict], name: str | None, parallel: bool) -> dict:
    """The JSON schema that meets tool_choice required (name None) or a named function for a
    model without a tool format: an array of {name, parameters} calls (SGLang's schema)."""
    from sglang.srt.entrypoints.openai.protocol import Tool, ToolChoice
    from sglang.srt.function_call.utils import get_json_schema_constraint

    choice = ToolChoice(function={"name": name}) if name else "required"
    return get_json_schema_constraint([Tool.model_validate(t) for t in tools], choice, parallel_tool_calls=parallel)


def calls_from_json(text: str, parser_name: str | None, history_calls: int) -> list[dict] | None:
    """Calls from output constrained by required_call_schema; None if it is not such JSON."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    data = [data] if isinstance(data, dict) else data
    if not isinstance(data, list) or not all(isinstance(c, dict) and "name" in c for c in data):
        return None
    return [{"id": tool_call_id(parser_name, c["name"], history_calls + i), "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c.get("parameters", {}), ensure_ascii=False)}}
            for i, c in enumerate(data)]


# -- a request's tool handling -----------------------------------------------------------------
@dataclass
class ToolPlan:
    """What a chat request's tools and tool_choice mean for this server. `template_tools`: for
    the chat template (None: not rendered); `parse_tools`: tools whose calls are parsed from the
    model's own format; `constraint`: (kind, spec) of engine.api.Constraint, when tool_choice
    required or a named function must be met by a grammar; `json_calls`: the output is then the
    JSON array of required_call_schema (a model without a tool format)."""
    template_tools: list[dict] | None = None
    parse_tools: list[dict] | None = None
    constraint: tuple[str, str] | None = None
    json_calls: bool = False
    history_calls: int = 0

    @property
    def parses_calls(self) -> bool:
        return bool(self.parse_tools) or self.json_calls


def plan_tools(req, tool_call_parser: str | None, reasoning_parser: str | None) -> ToolPlan:
    """Check tools and tool_choice against each other and the server; raises APIError (400)."""
    from server.errors import APIError

    def bad(message: str, param: str) -> APIError:
        return APIError(400, message, param=param, code="invalid_value")

    history = sum(len(m.tool_calls or []) for m in req.messages if m.role == "assistant")
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise bad("tools: function names must be unique", "tools")
    choice = req.tool_choice
    if choice is not None and not isinstance(choice, str) or choice in ("auto", "required"):
        if not tools:
            raise bad("tool_choice needs tools: the request has none", "tool_choice")
    named = None if choice is None or isinstance(choice, str) else choice.function.name
    if named is not None and named not in names:
        raise bad(f"tool_choice names function {named!r}, which is not among the tools "
                  f"({', '.join(names)})", "tool_choice")
    choice = choice or ("auto" if tools else "none")
    if choice == "none" or not tools:
        return ToolPlan(history_calls=history)
    if choice == "auto":
        if not tool_call_parser:
            raise bad("tool_choice auto (the default with tools) needs a tool-call parser for this model, and "
                      "this server has none (profile [server] tool_call_parser, --tool-call-parser); use "
                      "tool_choice none, required or a named function", "tool_choice")
        return ToolPlan(template_tools=tools, parse_tools=tools, history_calls=history)
    chosen = [t for t in tools if named is None or t["function"]["name"] == named]
    if tool_call_parser:
        return ToolPlan(template_tools=chosen, parse_tools=tools, history_calls=history,
                        constraint=("grammar", _native_format_grammar(tools, tool_call_parser, reasoning_parser,
                                                                      named, req.parallel_tool_calls)))
    schema = required_call_schema(tools, named, req.parallel_tool_calls)
    return ToolPlan(template_tools=chosen, json_calls=True, history_calls=history,
                    constraint=("json_schema", json.dumps(schema)))


def _native_format_grammar(tools: list[dict], parser_name: str, reasoning_parser: str | None, named: str | None,
                           parallel: bool) -> str:
    """The EBNF grammar (xgrammar's dialect) of the model's own tool-call format that SGLang
    builds for tool_choice required / a named function (a structural tag), thinking allowed
    first when the model reasons."""
    from sglang.srt.entrypoints.openai.protocol import Tool, ToolChoice
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    from server.errors import APIError

    choice = ToolChoice(function={"name": named}) if named else "required"
    parser = FunctionCallParser([Tool.model_validate(t) for t in tools], parser_name, tool_choice=choice)
    import xgrammar as xgr

    made = parser.get_structure_constraint(choice, parallel_tool_calls=parallel, thinking_mode=bool(reasoning_parser))
    kind, value = made or (None, None)
    # SGLang's legacy tags (hermes, ...) need its own grammar backend for "at least one call"
    if kind not in ("json_schema", "structural_tag") or hasattr(value, "structures"):
        raise APIError(400, f"tool_choice {named or 'required'} is not supported with the {parser_name} tool-call "
                       "parser: it has no grammar for its format here; use tool_choice auto", param="tool_choice",
                       code="invalid_value")
    text = value if isinstance(value, str) else value.model_dump_json(by_alias=True)
    if kind == "json_schema":
        return str(xgr.Grammar.from_json_schema(text, strict_mode=True))
    return str(xgr.Grammar.from_structural_tag(text))


def apply_tool_plan(plan: ToolPlan, params) -> None:
    """Set what the plan asks of the engine on its SamplingParams: special tokens kept for a
    tool-call parser (their markers are special tokens in Kimi-K2 and others), the grammar."""
    from engine.api import Constraint
    from server.errors import APIError

    if plan.parse_tools:
        params.skip_special_tokens = False
    if plan.constraint is not None:
        if params.constraint is not None:
            raise APIError(400, "tool_choice required or a named function cannot be combined with a structured "
                           "output (response_format): both constrain the whole answer", param="tool_choice",
                           code="invalid_value")
        kind, spec = plan.constraint
        params.constraint = Constraint(kind, spec, field="tool_choice")
