"""NativeEngine: the engine interface over BatchDecoder, driven by one background thread
(the server runs it in a process of its own: engine/process.py).

The thread admits waiting requests (prefilled together, up to a padded-token budget), then runs one batched decode
or speculative step for every active request, turns new tokens into text deltas, applies
the stop conditions (EOS, stop token ids, stop strings, max_tokens, context limit)
token by token — also inside an accepted draft run — and hands each delta to the
request's asyncio queue. Cancelled requests leave the batch before the next step.
On GPU, device-side (greedy) steps overlap: the next step is launched before the thread
reads and streams the current one, unless the batch is about to change.
Deadlines are not checked here: the server enforces them (server/generation.py) and aborts
a late request like any other.
With compiles made elsewhere (engine/background_compile.py) the thread serves eager steps and
each compiled shape takes over at the first step after it has loaded: no request waits for a compile.
What the tuning cache lacks about this machine it measures between its steps (engine/tuning.py).
Requests wait in engine/waiting.py (constrained ones for their grammar first). Each admitted
request that processes logits gets a LogitsProcessor, fed every token it emits.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from typing import AsyncIterator, Callable

import torch

from engine.api import (
    SHUTDOWN_TIMEOUT_S,
    EngineError,
    EngineInfo,
    ErrorCode,
    GenerationOutput,
    SamplingParams,
    SpecStats,
    stream_outputs,
)
from engine.background_compile import BackgroundCompiles
from engine.decoder import BatchDecoder, InFlight
from engine.detokenizer import IncrementalDetokenizer
from engine.logits_processing import LogitsProcessor
from engine.request import Request, batch_sampling, eos_ids
from engine.sampling import BatchSampling
from engine.tuning import Tuning
from engine.waiting import WaitingRequests

log = logging.getLogger("specserve.engine")



class NativeEngine:
    """Implements engine.api.Engine. `load_fn` builds (decoder, tokenizer, info) when started; the
    queue's and admission's settings are NativeConfig's (engine/config.py)."""

    def __init__(self, load_fn: Callable[[], tuple[BatchDecoder, object, EngineInfo]], info: EngineInfo, *,
                 max_waiting: int, prefill_tokens: int, prefill_min_rows: int, grammar_timeout_s: float,
                 background_compiles: Callable[[], BackgroundCompiles | None] = lambda: None,
                 tuning: Callable[[], Tuning | None] = lambda: None):
        self._load_fn = load_fn
        self._background_compiles = background_compiles
        self._tuning = tuning
        self.compiles: BackgroundCompiles | None = None   # set at load when a worker compiles the steps
        self.tuning: Tuning | None = None   # set at load when this machine is measured between steps
        # Called from the compile loader's thread with each change of the compile status (as_dict()).
        self.on_compile_news: Callable[[dict], None] = lambda status: None
        self.info = info
        # Admission: one prefill forward takes waiting requests while their padded length fits
        # `prefill_tokens`; with `prefill_min_rows` > 1 (offline generation) it waits until that
        # many rows are free, so that a full batch is not broken up by a prefill every step.
        self.prefill_tokens, self.prefill_min_rows = prefill_tokens, prefill_min_rows
        self.tokenizer = None
        self.decoder: BatchDecoder | None = None
        self._waiting = WaitingRequests(max_waiting, grammar_timeout_s)
        self._active: list[Request] = []
        self._batch_sampling: BatchSampling | None = None  # of _active; rebuilt when the batch changes
        self._next: InFlight | None = None  # a step launched before the host handled the previous one
        self._aborted: set[str] = set()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._ready = False
        self.dead: str | None = None
        self.eos_ids: set[int] = set()
        # Called by the engine thread after admitting requests and after each step, once their
        # deltas are emitted (engine/process.py sends them to the server as one message).
        self.flush: Callable[[], None] = lambda: None
        # generate()'s deltas of this loop iteration, delivered together by _flush.
        self._local: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue, GenerationOutput]] = []

    # -- interface ---------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready and self.dead is None

    @property
    def load(self) -> tuple[int, int]:
        return len(self._active), self._waiting.count

    @property
    def compile_status(self) -> dict | None:
        """Which decode shapes run compiled, which compile in the background, which stay eager, and under
        "tuning" what of this machine is measured and still measuring (None: neither compiles nor
        measurements in the background: the steps are all eager, or all compiled before ready)."""
        if self.compiles is not None:
            return self.compiles.status.as_dict()
        return {"tuning": self.tuning.status()} if self.tuning is not None else None

    async def start(self) -> None:
        await asyncio.to_thread(self.start_blocking)

    def start_blocking(self) -> None:
        """Start the engine thread; it loads (weights, tokenizer, compiles) and then serves.

        Loading runs in that thread too, so that one thread runs every parallel CPU op: a second
        thread's ops (the caller's, loading) leave OpenMP a second team of workers, and with more
        of them than cores libgomp stops spinning between parallel regions. Every region then
        waits for a sleeping worker: on 2 cores SmolLM2's float32 decode step on two threads took
        48 ms instead of 32. Background compiles start once loaded; their loading thread runs no
        parallel op."""
        loaded, failed = threading.Event(), []

        def load_and_run() -> None:
            try:
                self.decoder, self.tokenizer, self.info = self._load_fn()
                self.eos_ids = eos_ids(self.decoder.target, self.tokenizer)
                if (tuning := self._tuning()) is not None:
                    tuning.on_change = lambda: self.on_compile_news(self.compile_status)
                    self.tuning = tuning
                # What loading made lives as long as the engine: the collector skips it from now on (as
                # SGLang's freeze_gc and vLLM's freeze_gc_heap do), or a full collection walks torch's whole
                # heap mid-step.
                gc.collect()
                gc.freeze()
                if (compiles := self._background_compiles()) is not None:
                    compiles.on_change = lambda status: self.on_compile_news(status.as_dict())
                    compiles.idle = lambda: self.load == (0, 0)
                    compiles.start()
                    self.compiles = compiles
                if self.compile_status is not None:
                    self.on_compile_news(self.compile_status)
            except BaseException as e:  # raised again in the caller
                failed.append(e)
                return
            finally:
                loaded.set()
            self._run()

        self._thread = threading.Thread(target=load_and_run, name="native-engine", daemon=True)
        self._thread.start()
        loaded.wait()
        if failed:
            raise failed[0]
        self._ready = True

    async def shutdown(self) -> None:
        """Stop the engine thread (it ends the step in progress, then fails whatever is left).
        Waits by polling, not with asyncio.to_thread: at interpreter exit (atexit hooks) the
        default executor refuses new work ("cannot schedule new futures after shutdown")."""
        thread = self._signal_stop()
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        while thread is not None and thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._warn_if_running(thread)

    def stop_blocking(self) -> None:
        """shutdown() for a caller without an event loop (the engine process)."""
        thread = self._signal_stop()
        if thread is not None:
            thread.join(SHUTDOWN_TIMEOUT_S)
        self._warn_if_running(thread)

    def _signal_stop(self) -> threading.Thread | None:
        """Tell the engine thread to stop; the thread to wait for (None: none, or it is us)."""
        self._ready = False
        self._stop.set()
        self._waiting.wake()
        if self.compiles is not None:
            self.compiles.stop()
        thread = self._thread
        return None if thread is threading.current_thread() else thread

    @staticmethod
    def _warn_if_running(thread: threading.Thread | None) -> None:
        if thread is not None and thread.is_alive():
            log.warning("engine thread still running %.0f s after shutdown", SHUTDOWN_TIMEOUT_S)

    async def generate(self, request_id: str, prompt_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[GenerationOutput]:
        loop = asyncio.get_running_loop()
        out_q: asyncio.Queue[GenerationOutput] = asyncio.Queue()
        self.submit(request_id, prompt_ids, params, emit=lambda o: self._local.append((loop, out_q, o)))
        finished = False
        try:
            async for out in stream_outputs(out_q):
                finished = out.finished
                yield out
        finally:
            if not finished:  # client went away or was cancelled: free the slot
                self.abort(request_id)

    def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
               emit: Callable[[GenerationOutput], None]) -> None:
        """Queue a request; the engine thread calls `emit` with each of its deltas, the last one
        finished. Raises EngineError: OVERLOADED when the waiting queue is full,
        ENGINE_UNAVAILABLE when the engine cannot serve."""
        if not self.ready:
            raise EngineError(self.dead or "engine is not ready")
        waiting = self._waiting
        waiting.reserve()
        grammar = None
        if params.constraint is not None:
            try:
                grammar = waiting.grammar_compiler(self.tokenizer, self.decoder.target.config.vocab_size,
                                                   sorted(self.eos_ids)).submit(params.constraint)
            except EngineError:
                waiting.left()
                raise
            grammar.add_done_callback(lambda _: waiting.wake())
        gen = None
        if not params.greedy:
            gen = torch.Generator(device=self.decoder.device)
            gen.manual_seed(params.seed if params.seed is not None else torch.seed())
        waiting.inbox.put(Request(
            id=request_id, prompt=list(prompt_ids), params=params, emit=emit,
            detok=IncrementalDetokenizer(self.tokenizer, prompt_ids, params.stop, params.skip_special_tokens)
            if params.detokenize else None,
            generator=gen,
            spec=SpecStats() if self.decoder.spec else None,
            grammar=grammar, grammar_deadline=time.monotonic() + waiting.grammar_timeout_s,
        ))
        if self.dead is not None or self._stop.is_set():
            # The thread died (or stopped) while we queued: its last inbox drain may have run
            # before our put, and nobody would ever answer. `dead` is set before that drain.
            raise EngineError(self.dead or "engine is shutting down")

    def abort(self, request_id: str) -> None:
        """Drop a request (waiting or running) before the engine's next step; no more deltas."""
        self._aborted.add(request_id)
        self._waiting.wake()

    # -- engine thread -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                measuring = self.tuning is not None and not self.tuning.done
                self._waiting.drain(block=not self._active and not self._waiting.queued and not measuring)
                if self._next is not None and (self._aborted or self._will_admit()):
                    self._finish_next()  # the batch is about to change: no step may be in flight
                self._drop_aborted()
                self._waiting.check_grammars()
                self._admit()
                self._flush()  # first tokens go out now, not after the step below
                if self._active:
                    self._step()
                self._flush()
                if measuring and self._next is None:   # between two steps (engine/tuning.py)
                    self.tuning.between_steps(busy=bool(self._active or self._waiting))
        except Exception as e:  # the engine is dead: fail everything fast, never hang
            log.exception("engine thread died")
            self.dead = f"engine failed: {type(e).__name__}: {e}"
        else:  # shut down: whatever is still here gets an answer too
            self.dead = "engine has shut down"
        for r in self._active + self._waiting.clear():
            r.emit(self._failed(prompt_tokens=len(r.prompt), completion_tokens=len(r.output)))
        self._active.clear()
        self._waiting.drain(block=False, fail=self._failed)
        self._flush()
        gc.unfreeze()   # what start-up froze can be collected again (tests and tools build engine after engine)

    def _flush(self) -> None:
        """Deliver the deltas emitted since the last call: generate()'s with one wake-up per event
        loop, not one per request and step (each a write to the loop's self-pipe and a GIL
        hand-over), then the `flush` hook's (engine/process.py: one message to the server)."""
        if self._local:
            batch, self._local = self._local, []
            by_loop: dict[asyncio.AbstractEventLoop, list] = {}
            for loop, q, out in batch:
                by_loop.setdefault(loop, []).append((q, out))
            for loop, items in by_loop.items():
                try:
                    loop.call_soon_threadsafe(_put_all, items)
                except RuntimeError:  # that loop has closed: no one is left to read these
                    pass
        self.flush()

    def _failed(self, **counts) -> GenerationOutput:
        """The last delta of a request the dead (or stopped) engine will never finish."""
        return GenerationOutput(finish_reason="abort", error=self.dead, error_code=ErrorCode.ENGINE_UNAVAILABLE,
                                **counts)

    def _drop_aborted(self) -> None:
        if not self._aborted:
            return
        ids = set(self._aborted)
        self._aborted -= ids
        self._waiting.drop(ids)
        for i in reversed([i for i, r in enumerate(self._active) if r.id in ids]):
            self._release(i)

    def _will_admit(self) -> bool:
        """Whether waiting requests would be prefilled now (rows free, see prefill_min_rows)."""
        free, queued = self.decoder.max_batch - len(self._active), self._waiting.queued
        return bool(queued) and free > 0 and (not self._active or free >= min(self.prefill_min_rows, len(queued)))

    def _admit(self) -> None:
        dec, queued = self.decoder, self._waiting.queued
        while self._will_admit():
            free = dec.max_batch - len(self._active)
            group = [queued.popleft()]
            longest = len(group[0].prompt)
            while queued and len(group) < free:
                longest_next = max(longest, len(queued[0].prompt))
                if longest_next * (len(group) + 1) > self.prefill_tokens:
                    break
                group.append(queued.popleft())
                longest = longest_next
            # A prompt that a running row (or one of this group) holds already is not prefilled
            # again: those rows come after the group's prefill and copy it (decoder.prefill_shared).
            held = {tuple(r.prompt): i for i, r in enumerate(self._active) if not r.finish_reason}
            fresh = []
            for r in group:
                if tuple(r.prompt) not in held:
                    held[tuple(r.prompt)] = len(self._active) + len(fresh)
                    fresh.append(r)
            shared = [r for r in group if all(r is not f for f in fresh)]
            row = len(self._active)
            for r in fresh + shared:
                self._waiting.left()
                self._active.append(r)
                if r.params.processes_logits:
                    r.processor = LogitsProcessor(
                        r.params, r.prompt, dec.target.config.vocab_size, dec.device, sorted(self.eos_ids),
                        self._waiting.grammars, r.grammar.result() if r.grammar is not None else None)
            self._batch_sampling = None
            firsts = (dec.prefill_rows(row, [r.prompt for r in fresh], batch_sampling(fresh, dec.device))
                      if fresh else [])
            if shared:
                firsts += dec.prefill_shared(row + len(fresh), [held[tuple(r.prompt)] for r in shared],
                                             [r.prompt for r in shared], batch_sampling(shared, dec.device))
            for i, first in enumerate(firsts):
                self._active[row + i].consume(first.tokens, self.eos_ids, dec.max_context, logprobs=first.logprobs)
            for i in reversed(range(row, row + len(group))):
                if self._active[i].finish_reason:
                    self._release(i)

    def _step(self) -> None:
        dec, rows = self.decoder, len(self._active)
        if self._batch_sampling is None:  # host-to-device copies: not on every step
            self._batch_sampling = batch_sampling(self._active, dec.device)
        if not dec.device_side(self._batch_sampling):
            self._apply(dec.step(rows, self._batch_sampling))
            return
        current, self._next = self._next or dec.launch(rows), None
        # Overlap: the GPU starts the next step now, while this thread reads, detokenizes and
        # streams the current one. Only when nothing will change the batch meanwhile.
        if (dec.overlap and self._waiting.inbox.empty() and not self._will_admit() and not self._aborted
                and dec.room_to_launch(rows)):
            self._next = dec.launch(rows)
        self._apply(dec.collect(current))  # may collect the step in flight (a request ended)

    def _finish_next(self) -> None:
        step, self._next = self._next, None
        self._apply(self.decoder.collect(step))

    def _apply(self, results) -> None:
        """Consume one step's tokens; release finished rows (after any step still in flight,
        whose tokens for those rows are dropped: they lie past the request's end)."""
        for row, res in enumerate(results):
            r = self._active[row]
            if r.finish_reason:
                continue
            step = None
            if r.spec is not None:
                r.spec.record(res.proposed, res.accepted)
                step = SpecStats.of_step(res.proposed, res.accepted)
            r.consume(res.tokens, self.eos_ids, self.decoder.max_context, step, res.logprobs)
        if any(r.finish_reason for r in self._active):
            if self._next is not None:
                self._finish_next()
                return  # that call released the finished rows
            for row in reversed(range(len(self._active))):
                if self._active[row].finish_reason:
                    self._release(row)

    def _release(self, row: int) -> None:
        self._batch_sampling = None
        last = len(self._active) - 1
        if row != last:
            self.decoder.move_row(last, row)
            self._active[row] = self._active[last]
        self._active.pop()


def _put_all(items: list[tuple[asyncio.Queue, GenerationOutput]]) -> None:
    """On the event loop: each delta into its request's queue, in the order emitted."""
    for q, out in items:
        q.put_nowait(out)
