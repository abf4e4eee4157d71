"""The requests not yet running: queued from any thread, taken by the engine thread.

A request with a structured-output constraint waits for its grammar (compiled in a worker thread,
engine/grammar.py) before it queues; one that fails to compile, or takes longer than
`grammar_timeout_s`, ends with INVALID_REQUEST. Requests waiting for a grammar count as waiting:
at `max_waiting` a new one is refused as OVERLOADED.
"""
from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Callable

from engine.api import EngineError, ErrorCode, GenerationOutput
from engine.grammar import GrammarError, Grammars
from engine.request import Request


class WaitingRequests:
    def __init__(self, max_waiting: int, grammar_timeout_s: float):
        self.max_waiting, self.grammar_timeout_s = max_waiting, grammar_timeout_s
        self.inbox: queue.Queue[Request | None] = queue.Queue()   # None wakes the engine thread
        self.queued: collections.deque[Request] = collections.deque()   # in arrival order
        self.compiling: list[Request] = []   # waiting for their grammar
        self.count = 0   # every request submitted and not yet admitted or dropped
        self.grammars: Grammars | None = None   # made on the first constrained request
        self._lock = threading.Lock()

    def reserve(self) -> None:
        """Count a new request in, or refuse it: EngineError OVERLOADED."""
        with self._lock:
            if self.count >= self.max_waiting:
                raise EngineError(f"server is overloaded: {self.count} requests waiting", ErrorCode.OVERLOADED)
            self.count += 1

    def left(self) -> None:
        """One request left the queue (admitted, dropped or refused)."""
        with self._lock:
            self.count -= 1

    def grammar_compiler(self, tokenizer, vocab_size: int, eos_ids: list[int]) -> Grammars:
        with self._lock:
            if self.grammars is None:
                try:
                    self.grammars = Grammars(tokenizer, vocab_size, eos_ids)
                except Exception as e:  # xgrammar missing, or a tokenizer it cannot read
                    raise EngineError(f"structured outputs are not available: {type(e).__name__}: {e}",
                                      ErrorCode.INVALID_REQUEST) from None
            return self.grammars

    def wake(self) -> None:
        self.inbox.put(None)

    def drain(self, block: bool, fail: Callable[[], GenerationOutput] | None = None) -> None:
        """Move what was submitted into the queue (waiting up to 0.5 s for something with `block`);
        with `fail`, answer each with its delta instead."""
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
            while True:
                if item is not None:
                    if fail is not None:
                        item.emit(fail())
                    else:
                        (self.compiling if item.grammar is not None else self.queued).append(item)
                item = self.inbox.get_nowait()
        except queue.Empty:
            pass

    def drop(self, ids: set[str]) -> None:
        """Remove the requests `ids` (aborted) that wait here; their grammars stop waiting."""
        for r in [r for r in self.compiling if r.id in ids]:
            self.compiling.remove(r)
            r.grammar.cancel()
            self.left()
        for r in [r for r in self.queued if r.id in ids]:
            self.queued.remove(r)
            self.left()

    def check_grammars(self) -> None:
        """Queue requests whose grammar compiled; refuse those that failed or ran out of time
        (the compile thread finishes on its own: xgrammar cannot be interrupted)."""
        now = time.monotonic()
        for r in list(self.compiling):
            error = None
            if r.grammar.done():
                try:
                    r.grammar.result()
                except GrammarError as e:
                    error = str(e)
                except Exception as e:
                    error = f"{r.params.constraint.field}: {type(e).__name__}: {e}"
            elif now > r.grammar_deadline:
                r.grammar.cancel()
                error = (f"{r.params.constraint.field}: the grammar did not compile within "
                         f"{self.grammar_timeout_s:g} s")
            else:
                continue
            self.compiling.remove(r)
            if error is None:
                self.queued.append(r)
                continue
            self.left()
            r.emit(GenerationOutput(finish_reason="abort", error=error, error_code=ErrorCode.INVALID_REQUEST,
                                    prompt_tokens=len(r.prompt)))

    def clear(self) -> list[Request]:
        """Every request still here, removed (the engine is stopping)."""
        left = list(self.queued) + self.compiling
        self.queued.clear()
        self.compiling.clear()
        if self.grammars is not None:
            self.grammars.shutdown()
        return left
