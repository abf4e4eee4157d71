"""The OpenAI HTTP API as we accept and return it (Pydantic models at the HTTP boundary).

Requests are validated strictly (JSON types must match: "10" is not an integer), ignore
unknown fields (clients send many), and refuse known OpenAI features we do not implement
instead of silently ignoring them (echo with logprobs; best_of, suffix, audio, prediction, store,
... in the `unoffered` tables): every OpenAI field is honoured or refused with a 400 naming it.
Semantics follow vLLM's protocol.py: `max_completion_tokens` wins over `max_tokens`; `top_k` -1 or 0 disables it.
Context-dependent checks (prompt length, max_tokens vs. context) live in server/prompts.py.
"""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_serializer, model_validator

from engine.api import Constraint
from server.constraints import LEGACY_FIELDS, ResponseFormat, StructuredOutputs, constraint_of

MAX_STOP_STRINGS = 64
MAX_N = 16                 # choices per request (each an engine request; the prompt is prefilled once)
MAX_TOP_LOGPROBS = 20      # chat top_logprobs, as OpenAI
MAX_COMPLETION_LOGPROBS = 5  # completions logprobs, as OpenAI
MAX_LOGIT_BIAS = 1024      # entries of logit_bias
# int64, what every engine takes: SGLang raises past it, vLLM's server refuses it. What a seed
# buys differs: native and vLLM sample the request from its own seeded generator; SGLang uses
# it only with enable_deterministic_inference and otherwise samples unseeded (README).
SEED_RANGE = (-(1 << 63), (1 << 63) - 1)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool = False

    @field_validator("include_obfuscation")
    @classmethod
    def _no_obfuscation(cls, v):
        if v:
            raise ValueError("include_obfuscation is not supported (the stream is not padded)")
        return v


# Why a field is refused, where "not supported" alone would leave the client guessing.
_REFUSED_BECAUSE = {"functions": "deprecated by OpenAI: use tools and tool_choice",
                    "function_call": "deprecated by OpenAI: use tools and tool_choice"}


def refuse_unless_neutral(neutral: dict[str, tuple], name: str, value):
    """For OpenAI fields we do not offer: a value other than absent/null or one of `neutral`'s
    values (of the same JSON type: true is not 1) is refused with a 400 naming the field, never
    silently ignored."""
    if value is not None and not any(type(value) is type(v) and value == v for v in neutral[name]):
        why = f", {_REFUSED_BECAUSE[name]}" if name in _REFUSED_BECAUSE else ""
        raise ValueError(f"{name} is not supported by this server{why} (accepted: null"
                         + "".join(f", {json.dumps(v)}" for v in neutral[name]) + ")")
    return value


def unoffered(name: str, neutral: dict[str, tuple]) -> type[_Strict]:
    """A base declaring the OpenAI fields we do not offer, `neutral` mapping each to the values
    that mean "not used" (null always does): one table per request kind declares the fields and
    their check, so the two cannot drift apart. `name` also names the validator: a request may
    inherit several tables."""
    def check(cls, v, info):
        return refuse_unless_neutral(neutral, info.field_name, v)
    return create_model(name, __base__=_Strict, __validators__={f"{name}_check": field_validator(*neutral)(check)},
                        **{field: (Any, None) for field in neutral})


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    """A tool call of an earlier assistant message (the client sends the conversation back)."""
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(_Strict):
    name: str = Field(pattern=r"^[a-zA-Z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]  # OpenAI's "custom" tools are refused here
    function: FunctionDefinition


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


class ChatMessage(unoffered("_MessageUnoffered", {"audio": (), "function_call": (), "refusal": ()})):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant
    tool_call_id: str | None = None           # tool
    reasoning_content: str | None = None      # assistant, as SGLang and vLLM return it

    @model_validator(mode="after")
    def _content_needed(self):
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages have tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class _SamplingFields(unoffered("_SamplingUnoffered", {"best_of": (1,)})):
    """Fields shared by chat and text completions."""
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Logits processing (engine/logits_processing.py), vLLM's ranges; logit_bias keys are token ids.
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=2.0)
    min_tokens: int = Field(0, ge=0)
    logit_bias: dict[str, float] | None = None
    # Structured outputs (server/constraints.py)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None
    user: str | None = None  # an end-user id: no effect on the output

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        if isinstance(v, list) and len(v) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v):
        if v is None:
            return v
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} entries")
        for key, bias in v.items():
            if not (key.isascii() and key.isdigit()):
                raise ValueError(f"keys are token ids, got {key!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"token {key}: bias {bias} is outside [-100, 100]")
        return v

    @field_validator(*LEGACY_FIELDS)
    @classmethod
    def _legacy_guided(cls, v, info):
        if v is not None:
            raise ValueError(f"{info.field_name} is vLLM's retired name: use structured_outputs "
                             "({json | regex | choice | grammar | json_object}) or response_format")
        return v

    @model_validator(mode="after")
    def _constraint_checks(self):
        try:
            c = self.constraint
        except ValueError as e:
            raise ValueError(f"structured_outputs: {e}") from None
        if c is not None and self.min_tokens:
            raise ValueError("min_tokens cannot be combined with a structured output (the grammar decides "
                             "where the output ends)")
        limit = self.requested_max_tokens
        if limit is not None and self.min_tokens > limit:
            raise ValueError(f"min_tokens ({self.min_tokens}) is larger than max_tokens ({limit})")
        return self

    @property
    def constraint(self) -> Constraint | None:
        return constraint_of(self.response_format, self.structured_outputs)

    @property
    def token_logit_bias(self) -> dict[int, float]:
        return {int(k): b for k, b in (self.logit_bias or {}).items()}

    @field_validator("stream_options")
    @classmethod
    def _options_need_stream(cls, v, info):
        if v is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed with stream=true")
        return v

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


# OpenAI chat fields we do not offer, and the values that mean "not used" (null always does).
_CHAT_UNOFFERED = unoffered("_ChatUnoffered", {
    "audio": (), "modalities": (["text"],), "prediction": (), "store": (False,), "metadata": ({},),
    "service_tier": ("auto", "default"), "reasoning_effort": (), "verbosity": (), "web_search_options": (),
    "functions": (), "function_call": ()})


class ChatCompletionRequest(_SamplingFields, _CHAT_UNOFFERED):
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, v, info):
        if v and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs=true")
        return v

    @property
    def logprobs_k(self) -> int | None:
        """Top logprobs per token for the engine (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM/SGLang: e.g. {"thinking": false}
    # Identifiers with no effect on the output by definition, like `user`: accepted.
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


class CompletionRequest(_SamplingFields, unoffered("_CompletionUnoffered", {"suffix": ("",)})):
    """`prompt`: a string, a list of token ids, or a one-element list of either."""
    prompt: str | list[int]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)

    @property
    def logprobs_k(self) -> int | None:
        return self.logprobs

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and v and all(isinstance(x, (str, list)) for x in v):
            if len(v) > 1:
                raise ValueError("batched prompts are not supported: send one prompt per request")
            return v[0]
        return v

    @model_validator(mode="after")
    def _echo_without_logprobs(self):
        if self.echo and self.logprobs is not None:
            raise ValueError("echo with logprobs is not supported (prompt logprobs): drop one of echo, logprobs")
        return self


# -- responses ------------------------------------------------------------------------------
class SpecDecodingUsage(BaseModel):
    """Per-request speculative statistics (engine.api.SpecStats). accept_length =
    completion_tokens / verify_steps (bonus token included, as SGLang reports it);
    accept_rate = accepted / proposed draft tokens; accepted_per_position[i] = verify steps
    whose i-th draft token was accepted."""
    verify_steps: int
    proposed_draft_tokens: int
    accepted_draft_tokens: int
    accepted_per_position: list[int]
    accept_length: float
    accept_rate: float


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    spec_decoding: SpecDecodingUsage | None = None


class AssistantMessage(BaseModel):
    """`tool_calls` (OpenAI dicts: id, type, function {name, arguments}) and `reasoning_content`
    (SGLang's and vLLM's name) only when the output had them."""
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[dict] | None = None

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler):
        return {k: v for k, v in handler(self).items() if v is not None or k == "content"}


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    """Only the fields that change are sent (OpenAI sends the role once, in the first chunk)."""
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict] | None = None  # {index, id, type, function {name, arguments}}, then argument fragments

    @model_serializer(mode="wrap")
    def _drop_none(self, handler):
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specserve"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
