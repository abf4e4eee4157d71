"""SGLang behind engine.api.Engine: an in-process `sglang.Engine`, streamed via async_generate.

SGLang streams cumulative chunks (text and output_ids so far); we turn them into deltas. The
final chunk's meta_info carries the finish reason ({type: stop|length|abort}), token counts
and the speculative statistics, under 0.5.23 names (spec_num_correct_drafts, ...) or older
0.5.x ones (spec_accept_token_num, ...); both are read into the same SpecStats as the native
engine reports. Only the interface leaks out: the HTTP layer and metrics never see SGLang.
The request deadline is the server's (server/generation.py): it closes the stream, which
aborts the SGLang request.

Start-up: sglang.Engine is built in a thread (loading takes minutes; /health keeps answering),
so SGLang installs no SIGQUIT handler, and a scheduler that fails while loading sends SIGQUIT
to its parent (managers/scheduler.py), whose default action would kill this server. Until the
engine is up our handler turns that signal into a start failure (the server's exit 1).
Requests: SGLang raises ValueError for a request it refuses (sampling values out of range):
a 400, as in SGLang's own server. A seed is honoured only with enable_deterministic_inference
(SGLang samples unseeded otherwise; we log it once).
"""
from __future__ import annotations

import asyncio
import atexit
import importlib.util
import logging
import multiprocessing
import os
import re
import signal
import threading
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from engine.api import EngineError, EngineInfo, ErrorCode, GenerationOutput, SamplingParams, SpecStats

log = logging.getLogger("specserve.sglang")

SGLANG_MISSING = ("sglang is not installed in this Python: `pip install .[sglang]` (pins sglang==0.5.23 and "
                  "needs its CUDA kernels) or run the Docker image (FROM lmsysorg/sglang:v0.5.23)")


def require_sglang() -> None:
    if importlib.util.find_spec("sglang") is None:
        raise EngineError(SGLANG_MISSING)


def _sglang_engine(**server_args):
    try:
        import sglang
    except ImportError as e:
        raise EngineError(f"{SGLANG_MISSING} ({e})") from e
    return sglang.Engine(**server_args)


# -- translation (pure functions: tested without SGLang) ------------------------------------
def to_sglang_sampling(p: SamplingParams) -> dict:
    d = {"max_new_tokens": p.max_tokens, "temperature": p.temperature, "top_p": p.top_p,
         "top_k": p.top_k if p.top_k > 0 else -1, "ignore_eos": p.ignore_eos}
    if p.stop:
        d["stop"] = list(p.stop)
    if p.stop_token_ids:
        d["stop_token_ids"] = list(p.stop_token_ids)
    if p.seed is not None:
        d["sampling_seed"] = p.seed
    if not p.skip_special_tokens:
        d["skip_special_tokens"] = False
    # Penalties, bias and grammars: SGLang applies them itself (its own logits processors and
    # xgrammar backend), under its own names.
    for ours, theirs, neutral in (("presence_penalty", "presence_penalty", 0.0),
                                  ("frequency_penalty", "frequency_penalty", 0.0),
                                  ("repetition_penalty", "repetition_penalty", 1.0),
                                  ("min_tokens", "min_new_tokens", 0)):
        if getattr(p, ours) != neutral:
            d[theirs] = getattr(p, ours)
    if p.logit_bias:
        d["logit_bias"] = {str(t): b for t, b in p.logit_bias.items()}
    c = p.constraint
    if c is not None:
        if c.kind == "json_object":
            d["json_schema"] = '{"type": "object"}'  # what SGLang's own server sends for json_object
        elif c.kind == "json_schema":
            d["json_schema"] = c.spec
        elif c.kind == "regex":
            d["regex"] = c.spec
        elif c.kind == "choice":
            d["regex"] = "(" + "|".join(re.escape(x) for x in c.spec) + ")"
        else:
            d["ebnf"] = c.spec
    return d


def refusal(p: SamplingParams) -> str | None:
    """What this adapter cannot pass to SGLang (a 400 naming the field), or None."""
    if p.logprobs is not None:
        return "logprobs: not supported with the SGLang engine yet (the native engine has them)"
    return None


def finish_from_meta(meta: dict) -> tuple[str | None, str | None]:
    """(finish_reason as stop|length|abort or None while streaming, error message)."""
    fr = meta.get("finish_reason")
    if fr is None:
        return None, None
    kind, msg = (fr, None) if isinstance(fr, str) else (fr.get("type"), fr.get("message"))
    if kind in ("stop", "length"):
        return kind, None
    if kind == "abort":
        return "abort", msg or "aborted by SGLang"
    return "stop", None


def _first(meta: dict, *names):
    for n in names:
        if meta.get(n) is not None:
            return meta[n]
    return None


def spec_stats_from_meta(meta: dict, draft_tokens: int) -> SpecStats:
    """SpecStats from a final meta_info; histogram[k] = verify steps that accepted k drafts."""
    verify = int(meta.get("spec_verify_ct") or 0)
    if verify <= 0:
        return SpecStats()
    completion = int(meta.get("completion_tokens") or 0)
    accepted = _first(meta, "spec_num_correct_drafts", "spec_accept_token_num")
    accepted = int(accepted) if accepted is not None else max(0, completion - verify)
    proposed = _first(meta, "spec_num_proposed_drafts", "spec_draft_token_num")
    if proposed is None:
        rate = meta.get("spec_accept_rate")
        proposed = round(accepted / rate) if rate else verify * max(0, draft_tokens - 1)
    hist = _first(meta, "spec_correct_drafts_histogram", "spec_accept_histogram") or []
    per_position = [sum(hist[k] for k in range(i + 1, len(hist))) for i in range(len(hist) - 1)]
    while per_position and per_position[-1] == 0:
        per_position.pop()
    return SpecStats(verify_steps=verify, proposed_draft_tokens=int(proposed), accepted_draft_tokens=accepted,
                     accepted_per_position=per_position)


@dataclass
class CumulativeToDelta:
    """Turns SGLang's cumulative chunks into deltas."""
    text: str = ""
    n_ids: int = 0

    def delta(self, chunk: dict) -> tuple[str, list[int]]:
        ids = chunk.get("output_ids") or []
        new_ids = list(ids[self.n_ids:])
        self.n_ids = max(self.n_ids, len(ids))
        text = chunk.get("text")
        if text is None:
            return "", new_ids
        if text.startswith(self.text):
            new_text = text[len(self.text):]
        else:  # SGLang revised text it already sent; what was streamed cannot be taken back
            new_text = text[len(os.path.commonprefix([text, self.text])):]
            log.debug("sglang revised streamed text; sending the new suffix only")
        self.text = text
        return new_text, new_ids


# -- the engine ----------------------------------------------------------------------------
class SGLangEngine:
    """Implements engine.api.Engine. `server_args` are sglang ServerArgs keyword arguments
    (built from the profile by launch/engine_args.py); `engine_factory` replaces
    `sglang.Engine` in tests."""

    def __init__(self, server_args: dict, *, served_model_name: str | None = None,
                 engine_factory: Callable[..., object] | None = None,
                 tokenizer_loader: Callable[[str, bool], object] | None = None):
        if engine_factory is None:
            require_sglang()
        if server_args.get("incremental_streaming_output"):
            raise ValueError("incremental_streaming_output is not supported: this adapter expects cumulative chunks")
        self.server_args = dict(server_args)
        self._factory = engine_factory or _sglang_engine
        self._tokenizer_loader = tokenizer_loader or _auto_tokenizer
        a = self.server_args
        spec = a.get("speculative_algorithm") is not None
        self.info = EngineInfo(
            engine="sglang", model=served_model_name or os.path.basename(str(a["model_path"]).rstrip("/")),
            max_context=a.get("context_length") or 0, speculative=spec,
            steps=a.get("speculative_num_steps") or 0 if spec else 0,
            topk=a.get("speculative_eagle_topk") or 0 if spec else 0,
            draft_tokens=a.get("speculative_num_draft_tokens") or 0 if spec else 0,
            tp=a.get("tp_size", 1), device="cuda",
            extra={"model_path": a["model_path"], "draft_path": a.get("speculative_draft_model_path") or "",
                   "nnodes": a.get("nnodes", 1)})
        self.tokenizer = None
        self._engine = None
        self._seed_ignored = not a.get("enable_deterministic_inference")
        self._ready = False
        self._running = 0
        self.dead: str | None = None

    @property
    def ready(self) -> bool:
        return self._ready and self.dead is None

    @property
    def load(self) -> tuple[int, int]:
        """(requests streaming through this adapter, 0): SGLang keeps its own queue."""
        return self._running, 0

    async def start(self) -> None:
        a = self.server_args
        path = a.get("tokenizer_path") or a["model_path"]
        try:
            self.tokenizer = await asyncio.to_thread(self._tokenizer_loader, path, bool(a.get("trust_remote_code")))
            self._engine = await self._build_engine()
        except EngineError:
            raise
        except Exception as e:
            self.dead = f"sglang failed to start: {type(e).__name__}: {e}"
            raise EngineError(self.dead) from e
        self._attach_to_loop()
        tm = getattr(self._engine, "tokenizer_manager", None)
        self.info.max_context = int(getattr(tm, "context_len", 0) or self.info.max_context)
        self._ready = True

    async def _build_engine(self):
        """self._factory(**server_args) in a daemon thread (a scheduler stuck in loading must not
        hold up the exit), with SIGQUIT from a failing scheduler turned into an exception."""
        loop = asyncio.get_running_loop()
        built, quit_ = loop.create_future(), loop.create_future()
        children = {c.pid for c in multiprocessing.active_children()}

        def settle(result=None, error=None):
            if not built.done():
                built.set_exception(error) if error is not None else built.set_result(result)

        def build():
            try:
                result = self._factory(**self.server_args)
            except BaseException as e:  # noqa: BLE001 - handed to the event loop
                loop.call_soon_threadsafe(settle, None, e)
            else:
                loop.call_soon_threadsafe(settle, result)

        main = threading.current_thread() is threading.main_thread()
        if main:  # signal handlers exist in the main thread only
            loop.add_signal_handler(signal.SIGQUIT, lambda: quit_.done() or quit_.set_result(None))
        threading.Thread(target=build, name="sglang-engine-start", daemon=True).start()
        try:
            await asyncio.wait([built, quit_], return_when=asyncio.FIRST_COMPLETED)
        finally:
            if main:
                loop.remove_signal_handler(signal.SIGQUIT)
        if not quit_.done():
            return built.result()
        if main:  # more ranks may follow the first: the server is exiting, so ignore them
            signal.signal(signal.SIGQUIT, signal.SIG_IGN)
        _kill_new_children(children)
        # A rank forked just now may not be registered yet, and at exit multiprocessing only
        # SIGTERMs its children, which a fork of this process answers with the server's inherited
        # handler instead of dying, so exit would wait on it: kill again at exit (atexit runs
        # this before multiprocessing's own exit handler, registered earlier).
        atexit.register(_kill_new_children, children)
        if built.done():
            built.exception()  # retrieved; the SIGQUIT says more
        built.cancel()
        raise RuntimeError("an SGLang scheduler process failed while loading and sent SIGQUIT; its error is in "
                           "the log above")

    def _attach_to_loop(self) -> None:
        """Start SGLang's output loop on our event loop now, and keep the server's SIGTERM handler:
        SGLang installs its own on the loop (main thread), which would bypass uvicorn's drain."""
        tm = getattr(self._engine, "tokenizer_manager", None)
        if tm is None or not hasattr(tm, "auto_create_handle_loop"):
            return
        main = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGTERM) if main else None
        tm.auto_create_handle_loop()
        if main and previous is not None:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, previous)

    async def shutdown(self) -> None:
        self._ready = False
        if self._engine is not None:
            try:
                done = asyncio.get_running_loop().run_in_executor(None, self._engine.shutdown)
            except RuntimeError:  # at interpreter exit the default executor refuses new work
                self._engine.shutdown()
            else:
                await done
            self._engine = None

    def _abort(self, request_id: str) -> None:
        tm = getattr(self._engine, "tokenizer_manager", None)
        fn = getattr(tm, "abort_request", None) or getattr(self._engine, "abort_request", None)
        if fn is None:
            return
        try:
            fn(rid=request_id)
        except Exception:
            log.exception("sglang abort_request(%s) failed", request_id)

    async def generate(self, request_id: str, prompt_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[GenerationOutput]:
        if not self.ready:
            raise EngineError(self.dead or "engine is not ready")
        if (why := refusal(params)) is not None:
            raise EngineError(why, ErrorCode.INVALID_REQUEST)
        cum, finished, stream = CumulativeToDelta(), False, None
        self._running += 1
        if params.seed is not None and self._seed_ignored:
            self._seed_ignored = False  # said once
            log.warning("SGLang ignores a request's seed without enable_deterministic_inference ([sglang.extra] "
                        "in the profile); seeded requests are sampled unseeded")

        def final(reason: str, error: str | None, meta: dict | None = None, text="", ids=(),
                  code: ErrorCode | None = None) -> GenerationOutput:
            meta = meta or {}
            spec = spec_stats_from_meta(meta, self.info.draft_tokens) if self.info.speculative else None
            # SGLang gave up on this request alone, unless we are shutting it down
            if code is None and error is not None:
                code = ErrorCode.ENGINE_ERROR if self.ready else ErrorCode.ENGINE_UNAVAILABLE
            return GenerationOutput(text=text, token_ids=list(ids), finish_reason=reason, error=error, error_code=code,
                                    prompt_tokens=int(meta.get("prompt_tokens") or len(prompt_ids)),
                                    completion_tokens=int(meta.get("completion_tokens") or cum.n_ids), spec=spec,
                                    spec_step=spec)  # SGLang reports verify steps only on the final chunk
        try:
            stream = await self._engine.async_generate(
                input_ids=list(prompt_ids), sampling_params=to_sglang_sampling(params), stream=True, rid=request_id)
            async for chunk in stream:
                meta = chunk.get("meta_info") or {}
                text, ids = cum.delta(chunk)
                reason, error = finish_from_meta(meta)
                if reason is not None:
                    finished = True
                    yield final(reason, error, meta, text, ids)
                    return
                if text or ids:
                    yield GenerationOutput(text=text, token_ids=ids, prompt_tokens=len(prompt_ids),
                                           completion_tokens=cum.n_ids)
            finished = True
            yield final("abort", "sglang ended the stream without a finish reason")
        except ValueError as e:  # SGLang rejects a request (too long, bad sampling values) with ValueError
            finished = True
            yield final("abort", f"sglang rejected the request: {e}", code=ErrorCode.INVALID_REQUEST)
        finally:
            self._running -= 1
            if not finished:  # the client went away or the task was cancelled
                self._abort(request_id)
            if stream is not None and hasattr(stream, "aclose"):
                try:
                    await stream.aclose()
                except Exception:
                    pass


def _auto_tokenizer(path: str, trust_remote_code: bool):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


def _kill_new_children(before: set[int]) -> None:
    """SIGKILL the multiprocessing children not in `before` (the schedulers a start launched)."""
    for c in multiprocessing.active_children():
        if c.pid not in before:
            c.kill()
