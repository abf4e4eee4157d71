"""The OpenAI HTTP API as we accept and return it (Pydantic models at the HTTP boundary).

Requests are validated strictly (JSON types must match: "10" is not an integer), ignore
unknown fields (clients send many), and refuse known OpenAI features we do not implement
instead of silently ignoring them (n > 1, logprobs, echo, penalties). Semantics follow vLLM's
protocol.py: `max_completion_tokens` wins over `max_tokens`; `top_k` -1 or 0 disables it.
Context-dependent checks (prompt length, max_tokens vs. context) live in server/prompts.py.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

MAX_STOP_STRINGS = 64
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.Generator.manual_seed accepts


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _content_needed(self):
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class _SamplingFields(_Strict):
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
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Known OpenAI fields we do not implement: accepted only at their neutral values.
    logprobs: Any = None
    top_logprobs: Any = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    best_of: int | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        if isinstance(v, list) and len(v) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        return v

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v):
        if v != 1:
            raise ValueError("n > 1 is not supported: send one request per choice")
        return v

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v):
        if v not in (None, 1):
            raise ValueError("best_of > 1 is not supported")
        return v

    @field_validator("logprobs", "top_logprobs")
    @classmethod
    def _no_logprobs(cls, v):
        if v not in (None, False, 0):
            raise ValueError("logprobs are not supported")
        return v

    @field_validator("presence_penalty", "frequency_penalty", "repetition_penalty")
    @classmethod
    def _no_penalties(cls, v, info):
        if v != (1.0 if info.field_name == "repetition_penalty" else 0.0):
            raise ValueError("penalties are not supported")
        return v

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


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True


class CompletionRequest(_SamplingFields):
    """`prompt`: a string, a list of token ids, or a one-element list of either."""
    prompt: str | list[int]
    echo: bool = False
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and v and all(isinstance(x, (str, list)) for x in v):
            if len(v) > 1:
                raise ValueError("batched prompts are not supported: send one prompt per request")
            return v[0]
        return v

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v):
        if v:
            raise ValueError("echo is not supported")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v):
        if v:
            raise ValueError("suffix is not supported")
        return v


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
    role: Literal["assistant"] = "assistant"
    content: str


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
