"""The engine interface the HTTP layer, metrics and benchmarks talk to.

Implementations: the native engine in a thread (engine/scheduler.py) or in its own process
(engine/process.py, as the server runs it), SGLang (server/engines/sglang_engine.py) and vLLM
(server/engines/vllm_engine.py).
An engine turns token ids into an async stream of `GenerationOutput` deltas; the last one
carries the finish reason and the statistics.
"""
from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol

# How long stopping waits for the engine thread (or process) to end its step before giving up on it.
SHUTDOWN_TIMEOUT_S = 30.0


class ErrorCode(str, enum.Enum):
    """Why a request failed, set where the failure happens; server/errors.py maps each to an
    HTTP status, and the value is the OpenAI error body's `code`."""
    OVERLOADED = "overloaded"                  # the waiting queue is full: try again soon
    ENGINE_UNAVAILABLE = "engine_unavailable"  # not ready, dead or shut down
    ENGINE_ERROR = "engine_error"              # the engine gave up on this request alone
    TIMEOUT = "timeout"                        # past the request's deadline (server/generation.py)
    INVALID_REQUEST = "invalid_value"          # the engine cannot serve what was asked (a grammar that
                                               # does not compile, a field this engine lacks): a 400


class EngineError(RuntimeError):
    """The engine refused a request before queueing it; `code` says why (OVERLOADED or
    ENGINE_UNAVAILABLE)."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.ENGINE_UNAVAILABLE):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Constraint:
    """Structured output: the grammar every emitted token must keep valid (engine/grammar.py
    compiles it with xgrammar). kind: json_object (any JSON object) | json_schema (`spec` is the
    schema as JSON text) | regex | grammar (EBNF, xgrammar's dialect) | choice (`spec` a list of
    strings). `field`: the request field it came from, named in a compile error."""
    kind: str
    spec: str | tuple[str, ...] = ""
    field: str = "response_format"


@dataclass(frozen=True)
class TokenLogprob:
    """The target's log-probability of one emitted token (before penalties, bias, grammar and
    temperature: vLLM's default raw_logprobs) and the `top` most likely (token id, logprob)."""
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0       # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1                # <= 0: disabled
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    detokenize: bool = True         # False: token ids only, no text and no stop strings (offline data generation)
    skip_special_tokens: bool = True  # False: special tokens' text too (tool-call markers, as SGLang does)
    # Logits processing (engine/logits_processing.py), as vLLM defines it: presence and frequency
    # over the output tokens, repetition (divide positive logits, multiply negative) over prompt and
    # output; logit_bias added per token id; EOS and stop ids blocked for the first min_tokens.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)
    constraint: Constraint | None = None
    logprobs: int | None = None     # None: none; k: each emitted token's logprob and the top k (0..20)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1

    @property
    def processes_logits(self) -> bool:
        """Whether this request changes the target's logits before a token is chosen."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.min_tokens or self.logit_bias or self.constraint)


@dataclass
class SpecStats:
    """Per-request speculative statistics, shaped like SGLang's meta_info.

    accept_length = completion_tokens / verify_steps (bonus token included);
    accept_rate = accepted_draft_tokens / proposed_draft_tokens;
    accepted_per_position[i] = verify steps whose i-th draft token was accepted.
    """
    verify_steps: int = 0
    proposed_draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def accept_length(self, completion_tokens: int) -> float:
        return completion_tokens / self.verify_steps if self.verify_steps else 0.0

    @property
    def accept_rate(self) -> float:
        return self.accepted_draft_tokens / self.proposed_draft_tokens if self.proposed_draft_tokens else 0.0

    def record(self, proposed: int, accepted: int) -> None:
        self.verify_steps += 1
        self.proposed_draft_tokens += proposed
        self.accepted_draft_tokens += accepted
        if len(self.accepted_per_position) < accepted:
            self.accepted_per_position += [0] * (accepted - len(self.accepted_per_position))
        for i in range(accepted):
            self.accepted_per_position[i] += 1

    @classmethod
    def of_step(cls, proposed: int, accepted: int) -> "SpecStats":
        """One verify step's statistics."""
        s = cls()
        s.record(proposed, accepted)
        return s

    def plus(self, other: "SpecStats | None") -> "SpecStats":
        """The sum of two runs of verify steps (per-position counts aligned by position)."""
        if other is None:
            return self
        a, b = self.accepted_per_position, other.accepted_per_position
        n = max(len(a), len(b))
        pos = [x + y for x, y in zip(a + [0] * (n - len(a)), b + [0] * (n - len(b)))]
        return SpecStats(self.verify_steps + other.verify_steps,
                         self.proposed_draft_tokens + other.proposed_draft_tokens,
                         self.accepted_draft_tokens + other.accepted_draft_tokens, pos)


@dataclass
class GenerationOutput:
    """One streamed delta. `finish_reason` is set on the last one: stop | length | abort; a
    failed request's last one also carries `error` (the message) and `error_code`.
    `spec_step`: the verify steps that made this delta's tokens (metrics count them as they
    happen, as vLLM does per engine step); `spec`: the request's totals, on the last delta."""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    spec: SpecStats | None = None
    error: str | None = None
    spec_step: SpecStats | None = None
    error_code: ErrorCode | None = None  # with `error`; None there reads as ENGINE_ERROR
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the request asked for them

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def then(self, later: "GenerationOutput") -> "GenerationOutput":
        """This delta followed by `later`, as one delta."""
        return GenerationOutput(text=self.text + later.text, token_ids=self.token_ids + later.token_ids,
                                finish_reason=later.finish_reason, prompt_tokens=later.prompt_tokens,
                                completion_tokens=later.completion_tokens, spec=later.spec, error=later.error,
                                spec_step=later.spec_step.plus(self.spec_step) if later.spec_step else self.spec_step,
                                error_code=later.error_code,
                                logprobs=None if self.logprobs is None and later.logprobs is None
                                else (self.logprobs or []) + (later.logprobs or []))


@dataclass
class EngineInfo:
    """What the engine is, for /v1/models, logs and the info metric."""
    engine: str
    model: str
    max_context: int
    speculative: bool
    steps: int = 0
    topk: int = 0
    draft_tokens: int = 0
    tp: int = 1
    device: str = "cpu"
    extra: dict = field(default_factory=dict)


async def stream_outputs(queue: asyncio.Queue) -> AsyncIterator[GenerationOutput]:
    """A request's deltas from the queue its engine fills, until the finished one. An exception
    in the queue is raised (a refused request). A consumer that fell behind the engine (a slow
    client, a busy event loop) takes everything queued as one delta: fewer, larger chunks
    instead of a growing backlog."""
    while True:
        out = await queue.get()
        if isinstance(out, Exception):
            raise out
        while not out.finished and not queue.empty():
            out = out.then(queue.get_nowait())
        yield out
        if out.finished:
            return


class Engine(Protocol):
    info: EngineInfo
    tokenizer: object  # a transformers tokenizer (chat template, encode/decode)

    @property
    def ready(self) -> bool: ...

    @property
    def load(self) -> tuple[int, int]:
        """(running, waiting) requests."""
        ...

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    def generate(self, request_id: str, prompt_ids: list[int],
                 params: SamplingParams) -> AsyncIterator[GenerationOutput]: ...
