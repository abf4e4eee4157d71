"""The engine's settings, declared once: the speculative settings (SpecConfig) and the native
engine's own (NativeConfig; engine/loading.py's NativeEngineArgs adds the model paths).

The same classes are the launch profile's [speculative] and [native] tables
(launch/profiles.py) and generate `specserve`'s flags (launch/flags.py): a setting added here
is a profile key and a flag at once, with its description as the flag's help. They are
pydantic dataclasses: plain dataclasses to the engine, checked wherever they are built (JSON
types strictly, ranges, choices), so a bad value names its field; `field_error` lets a check
across fields name the field it is about.
"""
from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

CONFIG = ConfigDict(extra="forbid")
NATIVE_DTYPES = ("auto", "float32", "bfloat16", "float16")

# Steps per batch size: ((largest batch size, steps), ...) ascending (launch/steps_table.py).
StepsTable = tuple[tuple[int, int], ...]


def field_error(field: str, msg: str) -> PydanticCustomError:
    """A validation error about `field` of the object being checked (a check across fields runs
    on the whole object, so pydantic alone would not say which field is wrong)."""
    return PydanticCustomError("field_error", "{field}: {msg}", {"field": field, "msg": msg})


def one_of(*choices: str):
    """A string type that takes only `choices`; the error lists them."""
    def check(v: str) -> str:
        if v not in choices:
            raise ValueError(f"{v!r} is not one of {', '.join(choices)}")
        return v
    return Annotated[StrictStr, AfterValidator(check)]


def _device(v: str) -> str:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", v):
        raise ValueError(f"{v!r} is not auto, cpu, cuda or cuda:N")
    return v


def parse_steps_table(raw: Any) -> StepsTable:
    """A profile's {"size": steps} (TOML keys are strings; sorted here) or the engine's
    ((size, steps), ...) (kept in its order, which must ascend); ValueError says why."""
    if isinstance(raw, dict):
        pairs = list(raw.items())
    elif isinstance(raw, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in raw):
        pairs = list(raw)
    else:
        raise ValueError(f'expected dict {{ "batch size" = steps, ... }}, got {raw!r}')
    out = []
    for k, v in pairs:
        try:
            size = int(k)
        except (TypeError, ValueError):
            raise ValueError(f"batch size {k!r} is not an integer") from None
        if size < 1:
            raise ValueError(f"batch size {size} must be >= 1")
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"steps for batch size {size} must be an integer >= 0, got {v!r}")
        out.append((size, v))
    if isinstance(raw, dict):
        out.sort()
    sizes = [size for size, _ in out]
    if sizes != sorted(set(sizes)):
        raise ValueError(f"batch sizes must be ascending and distinct, got {sizes}")
    return tuple(out)


@dataclass(config=CONFIG)
class SpecConfig:
    """EAGLE-3 speculation: a chain (topk 1) of `steps` drafts, or an SGLang-style tree of
    `draft_tokens` nodes chosen from `topk` candidates per step."""
    steps: StrictInt = Field(3, ge=1, description="speculative steps: drafts per verify (the tree's depth)")
    topk: StrictInt = Field(1, ge=1, description="draft tree branching (1: a chain)")
    draft_tokens: StrictInt = Field(0, description="draft tokens verified per step (0: steps + 1, a chain's)")
    # Chains only: a step of B rows drafts the steps of the first entry with B <= its size (the
    # last entry beyond). 0 drafts nothing: the target verifies just the pending token and the
    # drafter reads its backlog of such steps when drafting resumes (engine/spec_worker.py, greedy
    # rows; sampled rows extend it every step). Speculation pays less as the batch grows
    # (more rows share each forward's weight reads).
    steps_by_batch: Annotated[StepsTable, BeforeValidator(parse_steps_table)] = Field(
        (), description="steps per batch size, { \"largest batch size\" = steps, ... } (empty: steps)")
    # Chains only, instead of steps_by_batch: the engine times its own steps at each batch size at
    # load and drafts there the steps that give the most tokens per second (engine/steps_by_cost.py).
    accept_rates: tuple[Annotated[StrictFloat, Field(ge=0, le=1)], ...] = Field(
        (), description="measured for this drafter: the share of verifies whose first 1, 2, ... drafts were "
                        "accepted (one rate per step); with it the steps per batch size come from step costs "
                        "measured on this machine (empty: steps_by_batch, or steps)")

    @model_validator(mode="after")
    def _consistent(self):
        if self.topk == 1:
            if self.draft_tokens not in (0, self.steps + 1):
                raise field_error("draft_tokens", f"topk = 1 needs draft_tokens = steps + 1 = {self.steps + 1}, "
                                                  f"got {self.draft_tokens}")
            self.draft_tokens = self.steps + 1
        elif self.draft_tokens < 2:
            raise field_error("draft_tokens", f"tree drafting (topk = {self.topk}) needs draft_tokens >= 2, "
                                              f"got {self.draft_tokens}")
        if self.steps_by_batch:
            if self.topk != 1:
                raise field_error("steps_by_batch", f"steps per batch size are for chains (topk = 1), "
                                                    f"not topk = {self.topk}")
            most = max(k for _, k in self.steps_by_batch)
            if most > self.steps:
                raise field_error("steps", f"must be >= the most steps_by_batch drafts ({most}), got {self.steps}")
        if self.accept_rates:
            if self.topk != 1 or self.steps_by_batch:
                raise field_error("accept_rates", "choose the steps of a chain (topk = 1) from measured costs: "
                                                  "give either them or steps_by_batch")
            if len(self.accept_rates) < self.steps:
                raise field_error("accept_rates", f"needs one rate per step ({self.steps}), "
                                                  f"got {len(self.accept_rates)}")
            if list(self.accept_rates) != sorted(self.accept_rates, reverse=True):
                raise field_error("accept_rates", f"can only fall from one step to the next (the first i+1 drafts "
                                                  f"are accepted at most as often as the first i), got "
                                                  f"{list(self.accept_rates)}")
        return self

    def steps_for(self, rows: int) -> int:
        """Draft steps of an engine step over `rows` rows."""
        for size, steps in self.steps_by_batch:
            if rows <= size:
                return steps
        return self.steps_by_batch[-1][1] if self.steps_by_batch else self.steps

    @property
    def headroom(self) -> int:
        """Cache positions a step may write beyond the committed length."""
        return max(self.draft_tokens, self.steps * self.topk) + 2

    @property
    def label(self) -> str:
        """How results name it: the step count of a chain, STEPSxTOPKxTOKENS of a tree."""
        return str(self.steps) if self.topk == 1 else f"{self.steps}x{self.topk}x{self.draft_tokens}"


def parse_trees(text: str) -> list[SpecConfig]:
    """SGLang-style trees given as "STEPSxTOPKxTOKENS,..." (e.g. 6x8x32), each with topk > 1
    (a chain is a step count). ValueError says which one is wrong."""
    trees = []
    for t in filter(None, text.split(",")):
        try:
            steps, topk, tokens = (int(v) for v in t.split("x"))
            tree = SpecConfig(steps=steps, topk=topk, draft_tokens=tokens)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{t!r}: a tree is STEPSxTOPKxTOKENS ({e})") from None
        if topk < 2:
            raise ValueError(f"{t!r}: topk {topk} is a chain: give it as a step count")
        trees.append(tree)
    return trees


@dataclass(config=CONFIG)
class NativeConfig:
    """The native engine's own settings (the profile's [native] table)."""
    device: Annotated[StrictStr, AfterValidator(_device)] = Field("auto", description="auto | cpu | cuda | cuda:N")
    dtype: one_of(*NATIVE_DTYPES) = Field("auto", description=" | ".join(NATIVE_DTYPES))
    gguf_q4: StrictBool = Field(False, description="keep a GGUF's Q4_0/Q4_1 projections 4-bit (CPU: "
                                                   "models/q4_linear.py; fewer bytes read a step)")
    max_batch: StrictInt = Field(16, ge=1, description="requests decoded together")
    max_context: StrictInt = Field(0, ge=0, description="tokens per request (0: the model's maximum)")
    max_waiting: StrictInt = Field(256, ge=1, description="queued requests before 503 overloaded")
    prefill_tokens: StrictInt = Field(8192, ge=1, description="padded prompt tokens per prefill forward "
                                                              "(several requests at once)")
    prefill_min_rows: StrictInt = Field(1, ge=1, description="admit only when this many rows are free "
                                                             "(> 1: offline throughput)")
    cpu_threads: StrictInt = Field(0, ge=0, description="CPU intra-op threads (0: every core, at most 8)")
    compile: StrictBool = Field(False, description="torch.compile the decode steps (fused kernels; compiling "
                                                   "takes a minute or more per batch size)")
    compile_max_batch: StrictInt = Field(1, ge=0, description="with compile: batch sizes compiled at start (0: none, "
                                                              "nor any CUDA graph); larger ones compile on first use "
                                                              "with compile_before_ready, else stay eager; without "
                                                              "compile a GPU captures every batch size")
    compile_before_ready: StrictBool = Field(True, description="with compile: compile before /health turns ready "
                                                               "(false: serve eager steps at once while a process "
                                                               "of its own compiles them, each compiled step taking "
                                                               "over between two engine steps; what tuning_cache "
                                                               "lacks is measured between engine steps first)")
    prefill_graphs: StrictBool = Field(False, description="GPU: prefill each prompt of up to 256 tokens as a "
                                                          "captured CUDA graph (compiled with compile), groups of "
                                                          "up to 8 one prompt at a time (padded to a power of "
                                                          "two; on CPU it only pads)")
    compile_prefill: StrictBool = Field(True, description="with compile and prefill_graphs: compile the captured "
                                                          "prefills too (a shorter time to first token; one more "
                                                          "compile each for the target and the drafter at start)")
    compile_cache: StrictStr = Field("", description="with compile: a folder where the compiled decode steps are "
                                                     "saved ahead of time, and loaded by a restart instead of "
                                                     "being traced and compiled again (empty: none; unused "
                                                     "without compile, so a profile that sets it runs with "
                                                     "--no-compile)")
    tuning_cache: StrictStr = Field("", description="a folder keeping what the engine measures about this machine "
                                                    "once (CPU float32 product forms, step costs per batch size), "
                                                    "so every server here runs the same choice (empty: measure at "
                                                    "each start)")
    deterministic: StrictBool = Field(False, description="greedy output that depends on neither speculation nor "
                                                         "the batch, in bfloat16 too: every decode step runs the "
                                                         "target over max_batch rows of the verify step's width "
                                                         "(slower plain decoding: docs/speculative-decoding.md)")
    grammar_timeout_s: StrictFloat = Field(10.0, gt=0, description="a structured-output grammar not compiled by "
                                                                   "then fails its request with a 400 (seconds)")
