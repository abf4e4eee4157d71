"""vLLM behind engine.api.Engine: an in-process `AsyncLLM` (the engine vLLM's own OpenAI server
drives), streamed as deltas (RequestOutputKind.DELTA).

vLLM has its own torch pins, so this adapter runs only in a Python where vllm imports
(.venv-vllm, `make vllm-venv`); the launcher says so at start-up otherwise. vLLM applies every
stop condition itself (max_tokens, stop strings, stop token ids, EOS, max_model_len), as well
as penalties, min_tokens, seeds, logprobs (raw, as ours) and structured outputs (xgrammar); what
it refuses under speculation (logit_bias) is a 400 here, before it reaches vLLM.

Statistics: our speculative counters are vLLM's own per-step ones: the SpecDecodingStats its
stat loggers receive each engine step (drafts, draft tokens, accepted, accepted per position),
summed by a stat logger of ours (`StepStats`, read by server/metrics.py at scrape time through
`step_spec`), which also keeps the scheduler's running/waiting counts (`load`). A request's
usage comes from vLLM's per-request accounting (RequestSpecDecodeMetrics,
`per_request_spec_decode_metrics="summary"`: the histogram of accepted drafts), reported when
the engine core finishes it; a request a stop string ended finishes in vLLM's front-end, which
has no such record, so its usage has no spec_decoding (its steps are in the counters).

Start-up: AsyncLLM is built in a thread (loading takes minutes; /health keeps answering 503).
A request the client leaves is aborted in vLLM (`AsyncLLM.abort`). A dead engine core (vLLM's
monitor thread sets `errored`) turns `ready` false, so /health answers 503.
"""
from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
from dataclasses import dataclass, field
from typing import AsyncIterator

from engine.api import EngineError, EngineInfo, ErrorCode, GenerationOutput, SamplingParams, SpecStats, TokenLogprob
from models.tokenizer import load_tokenizer

log = logging.getLogger("specserve.vllm")

VLLM_MISSING = ("vllm is not importable in this Python ({}): the vLLM engine runs in vLLM's own environment; "
                "`make vllm-venv`, then start the server with .venv-vllm/bin/python -m launch.cli --profile ...")


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise EngineError(VLLM_MISSING.format("no module named vllm"))


# -- translation (pure functions: tested without vLLM) --------------------------------------
def refusal(p: SamplingParams, speculative: bool) -> str | None:
    """What vLLM cannot serve of this request (a 400 naming the field), or None."""
    if p.logit_bias and speculative:
        return ("logit_bias: vLLM does not support logit_bias with speculative decoding (the native engine has "
                "it; or serve this profile with --no-spec)")
    return None


def to_vllm_sampling(p: SamplingParams) -> dict:
    """vllm.SamplingParams keyword arguments (structured_outputs as a dict of
    StructuredOutputsParams fields)."""
    d = {"max_tokens": p.max_tokens, "temperature": p.temperature, "top_p": p.top_p,
         "top_k": p.top_k if p.top_k > 0 else 0, "seed": p.seed, "stop": list(p.stop),
         "stop_token_ids": list(p.stop_token_ids), "ignore_eos": p.ignore_eos, "detokenize": p.detokenize,
         "skip_special_tokens": p.skip_special_tokens, "presence_penalty": p.presence_penalty,
         "frequency_penalty": p.frequency_penalty, "repetition_penalty": p.repetition_penalty,
         "min_tokens": p.min_tokens, "logprobs": p.logprobs}
    if p.logit_bias:
        d["logit_bias"] = dict(p.logit_bias)
    c = p.constraint
    if c is not None:
        d["structured_outputs"] = {"json_object": {"json_object": True}, "json_schema": {"json": c.spec},
                                   "regex": {"regex": c.spec}, "choice": {"choice": list(c.spec)},
                                   "grammar": {"grammar": c.spec}}[c.kind]
    return d


def spec_stats(histogram: list[int], num_draft_tokens: int) -> SpecStats:
    """SpecStats from vLLM's per-request histogram (histogram[j] = verify steps that accepted
    j drafts): position i was accepted in every step that accepted more than i."""
    per_position = [sum(histogram[i + 1:]) for i in range(len(histogram) - 1)]
    while per_position and per_position[-1] == 0:
        per_position.pop()
    return SpecStats(verify_steps=sum(histogram), proposed_draft_tokens=num_draft_tokens,
                     accepted_draft_tokens=sum(j * n for j, n in enumerate(histogram)),
                     accepted_per_position=per_position)


def token_logprobs(positions, k: int) -> list[TokenLogprob]:
    """vLLM's per-position {token id: Logprob(logprob, rank)} (the chosen token and the top k)."""
    out = []
    for chosen, entries in positions:
        top = sorted(((t, e) for t, e in entries.items() if e.rank is not None and e.rank <= k),
                     key=lambda te: te[1].rank)
        out.append(TokenLogprob(entries[chosen].logprob, tuple((t, e.logprob) for t, e in top[:k])))
    return out


def finish(reason: str | None) -> tuple[str, str | None]:
    """(our finish reason, error) for vLLM's: stop | length | abort | error | repetition."""
    if reason in ("stop", "length"):
        return reason, None
    if reason == "repetition":
        return "stop", None
    return "abort", f"vLLM ended the request: {reason}"


@dataclass
class StepStats:
    """What vLLM's stat loggers see per engine step: the scheduler's running and waiting
    requests and the speculative counters, summed over steps (SpecDecodingStats.observe_draft)."""
    running: int = 0
    waiting: int = 0
    spec: SpecStats = field(default_factory=SpecStats)

    def record(self, scheduler_stats) -> None:
        if scheduler_stats is None:
            return
        self.running, self.waiting = scheduler_stats.num_running_reqs, scheduler_stats.num_waiting_reqs
        s = scheduler_stats.spec_decoding_stats
        if s is not None and s.num_drafts:
            self.spec = self.spec.plus(SpecStats(s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens,
                                                 list(s.num_accepted_tokens_per_pos)))


def stat_logger_factory(stats: StepStats):
    """A vLLM StatLoggerFactory whose loggers write into `stats`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _Logger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            stats.record(scheduler_stats)

        def log_engine_initialized(self):
            pass

    return _Logger


def _build_async_llm(engine_args: dict, stats: StepStats):
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as e:
        raise EngineError(VLLM_MISSING.format(e)) from e
    asyncio.set_event_loop(asyncio.new_event_loop())  # this thread's; vLLM binds its sockets on first use
    return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args), stat_loggers=[stat_logger_factory(stats)])


# -- the engine ----------------------------------------------------------------------------
class VLLMEngine:
    """Implements engine.api.Engine. `engine_args`: vLLM AsyncEngineArgs keyword arguments
    (launch/engine_args.py vllm_engine_args)."""

    def __init__(self, engine_args: dict, *, served_model_name: str | None = None):
        require_vllm()
        self.engine_args = dict(engine_args)
        a = self.engine_args
        spec = a.get("speculative_config") or {}
        steps = int(spec.get("num_speculative_tokens") or 0)
        self.info = EngineInfo(
            engine="vllm", model=served_model_name or os.path.basename(str(a["model"]).rstrip("/")),
            max_context=a.get("max_model_len") or 0, speculative=bool(spec), steps=steps, topk=1 if spec else 0,
            draft_tokens=steps + 1 if spec else 0, tp=a.get("tensor_parallel_size", 1), device="",
            extra={"model_path": a["model"], "draft_path": spec.get("model", ""),
                   "pp": a.get("pipeline_parallel_size", 1), "nnodes": a.get("nnodes", 1)})
        self.tokenizer = None
        self.stats = StepStats()
        self._llm = None
        self._ready = False
        self._start_error: str | None = None

    @property
    def ready(self) -> bool:
        return self._ready and not self._llm.errored

    @property
    def dead(self) -> str | None:
        if self._start_error:
            return self._start_error
        if self._llm is not None and self._llm.errored:
            return "the vLLM engine core died (its error is in the log above)"
        return None

    @property
    def load(self) -> tuple[int, int]:
        """vLLM's scheduler counts from its last engine step (an abort reaches them one step later),
        bounded by the requests its front-end still holds."""
        if self._llm is None:
            return 0, 0
        open_ = self._llm.get_num_unfinished_requests()
        running = min(self.stats.running, open_)
        return running, min(self.stats.waiting, open_ - running)

    @property
    def step_spec(self) -> SpecStats | None:
        """vLLM's per-step speculative counters, summed (None without speculation)."""
        return self.stats.spec if self.info.speculative else None

    async def start(self) -> None:
        try:
            # the native engine's tokenizer loader: the same chat prompts as there (vLLM reads the same files)
            self.tokenizer = await asyncio.to_thread(load_tokenizer, self.engine_args.get("tokenizer")
                                                     or self.engine_args["model"])
            self._llm = await asyncio.to_thread(_build_async_llm, self.engine_args, self.stats)
        except EngineError as e:
            self._start_error = str(e)
            raise
        except Exception as e:
            self._start_error = f"vllm failed to start: {type(e).__name__}: {e}"
            raise EngineError(self._start_error) from e
        cfg = self._llm.vllm_config
        self.info.max_context = int(cfg.model_config.max_model_len)
        self.info.device = str(cfg.device_config.device_type)
        self._ready = True

    async def shutdown(self) -> None:
        self._ready = False
        if self._llm is not None:
            llm, self._llm = self._llm, None
            await asyncio.to_thread(llm.shutdown)

    async def generate(self, request_id: str, prompt_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[GenerationOutput]:
        if not self.ready:
            raise EngineError(self.dead or "engine is not ready")
        if (why := refusal(params, self.info.speculative)) is not None:
            raise EngineError(why, ErrorCode.INVALID_REQUEST)
        from vllm import SamplingParams as VSamplingParams
        from vllm.exceptions import GracefulHTTPError, VLLMClientError, VLLMServerError
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
        from vllm.v1.engine.exceptions import EngineDeadError

        kw = to_vllm_sampling(params)
        if "structured_outputs" in kw:
            kw["structured_outputs"] = StructuredOutputsParams(**kw["structured_outputs"])
        try:
            vparams = VSamplingParams(**kw, output_kind=RequestOutputKind.DELTA)
        except (ValueError, TypeError, VLLMClientError) as e:
            raise EngineError(f"vLLM refused the sampling parameters: {e}", ErrorCode.INVALID_REQUEST) from None
        n_ids, finished, stream = 0, False, None

        def final(error: str, code: ErrorCode) -> GenerationOutput:
            return GenerationOutput(finish_reason="abort", error=error, error_code=code,
                                    prompt_tokens=len(prompt_ids), completion_tokens=n_ids)
        try:
            stream = self._llm.generate({"prompt_token_ids": list(prompt_ids)}, vparams, request_id)
            async for out in stream:
                o = out.outputs[0]
                n_ids += len(o.token_ids)
                lps = None
                if params.logprobs is not None and o.logprobs is not None:
                    lps = token_logprobs(zip(o.token_ids, o.logprobs), params.logprobs)
                delta = GenerationOutput(text=o.text, token_ids=list(o.token_ids), logprobs=lps,
                                         prompt_tokens=len(out.prompt_token_ids or prompt_ids),
                                         completion_tokens=n_ids)
                if out.finished:
                    finished = True
                    delta.finish_reason, delta.error = finish(o.finish_reason)
                    if delta.error:
                        delta.error_code = ErrorCode.ENGINE_ERROR
                    m = o.spec_decode_metrics  # None when a stop string ended it (vLLM's front-end saw it)
                    if m is not None:
                        delta.spec = spec_stats(list(m.histogram), m.num_draft_tokens)
                    yield delta
                    return
                if delta.text or delta.token_ids:
                    yield delta
            finished = True
            yield final("vLLM ended the stream without a finish reason", ErrorCode.ENGINE_ERROR)
        except EngineDeadError as e:
            finished = True
            yield final(f"the vLLM engine died: {e}", ErrorCode.ENGINE_UNAVAILABLE)
        except GracefulHTTPError as e:  # vLLM's queue limits
            finished = True
            yield final(f"vLLM refused the request: {e}", ErrorCode.OVERLOADED)
        except (VLLMClientError, ValueError) as e:
            finished = True
            yield final(f"vLLM rejected the request: {e}", ErrorCode.INVALID_REQUEST)
        except VLLMServerError as e:  # vLLM gave up on this request alone (EngineGenerateError)
            finished = True
            yield final(f"vLLM failed the request: {type(e).__name__}: {e.__cause__ or e}", ErrorCode.ENGINE_ERROR)
        finally:
            if stream is not None:
                await stream.aclose()  # vLLM's generator aborts an unfinished request on close
            if not finished and self._llm is not None and not self._llm.errored:
                await self._llm.abort(request_id)
