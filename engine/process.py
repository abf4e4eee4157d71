"""The native engine in its own process, the layout SGLang and vLLM serve with.

In one process the engine thread and the HTTP event loop share a GIL: each streamed token's
event-loop work (a few hundred microseconds of Python on CPU) stalls the next decode step,
and a crash in the engine takes the server down. Here `NativeEngine` runs in a spawned
child; the server process keeps HTTP, templates and the tokenizer, and the two exchange small
pickled messages over a pipe:

  server -> engine   ("add", request_id, prompt_ids, params) | ("abort", request_id) | ("stop",)
  engine -> server   ("ready", info) | ("failed", reason)                           at start
                     ("out", [(request_id, GenerationOutput), ...], (running, waiting), dead)
                                       one message per engine loop turn; dead: None or why
                     ("refused", request_id, overloaded, reason)

If the child dies, every open request ends with an error and /health reports the engine dead.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import multiprocessing
import signal
import threading
from multiprocessing.connection import Connection

from engine.api import EngineError, EngineInfo, EngineOverloaded, GenerationOutput, SamplingParams, stream_outputs
from engine.loading import NativeEngineArgs, build_engine, engine_info

log = logging.getLogger("specserve.engine")

SHUTDOWN_TIMEOUT_S = 30.0


class EngineProcess:
    """Implements engine.api.Engine with the native engine in a child process."""

    def __init__(self, args, info: EngineInfo, log_format: str | None = None, log_level: str = "info"):
        self.args = args  # engine.loading.NativeEngineArgs
        self.info = info
        self.tokenizer = None
        self.dead: str | None = None
        self._log = (log_format, log_level)
        self._proc: multiprocessing.Process | None = None
        self._conn: Connection | None = None
        self._streams: dict[str, asyncio.Queue] = {}
        self._load = (0, 0)
        self._ready = False
        self._stopping = False
        self._exit_report: asyncio.Task | None = None

    @property
    def ready(self) -> bool:
        return self._ready and self.dead is None

    @property
    def load(self) -> tuple[int, int]:
        return self._load

    async def start(self) -> None:
        from engine.loading import load_tokenizer

        ctx = multiprocessing.get_context("spawn")  # no fork: the parent may hold threads and CUDA state
        self._conn, child_end = ctx.Pipe()
        # daemon: ended at exit even if shutdown never ran (a joined child would wait for the EOF
        # that only our exit sends). Inductor's default compile workers (subprocess) allow it.
        self._proc = ctx.Process(target=child_main, args=(self.args, child_end, self._log),
                                 name="specserve-engine", daemon=True)
        self._proc.start()
        child_end.close()
        self.tokenizer = await asyncio.to_thread(load_tokenizer, self.args.model)
        kind, payload = await asyncio.to_thread(self._first_message)
        if kind != "ready":
            self._proc.join(5)
            raise EngineError(payload)
        self.info = payload
        asyncio.get_running_loop().add_reader(self._conn.fileno(), self._on_readable)
        self._ready = True

    def _first_message(self) -> tuple[str, object]:
        """Wait for the child's "ready" or "failed" (loading can take minutes: weights, compiles)."""
        while not self._conn.poll(0.5):
            if not self._proc.is_alive():
                break
            if self._stopping:
                return "failed", "server stopped while the engine was loading"
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(5)
            return "failed", f"engine process exited with code {self._proc.exitcode} while loading"

    def _on_readable(self) -> None:
        """Event-loop reader: hand every message the child has sent to its request's queue."""
        try:
            while self._conn.poll():
                msg = self._conn.recv()
                if msg[0] == "out":
                    for request_id, out in msg[1]:
                        if (q := self._streams.get(request_id)) is not None:
                            q.put_nowait(out)
                    self._load = msg[2]
                    self.dead = self.dead or msg[3]
                elif msg[0] == "refused":
                    _, request_id, overloaded, reason = msg
                    if (q := self._streams.get(request_id)) is not None:
                        q.put_nowait((EngineOverloaded if overloaded else EngineError)(reason))
        except (EOFError, OSError):
            self._child_gone()

    def _child_gone(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._conn.fileno())
        self.dead = "engine has shut down" if self._stopping else "engine process died"
        for q in self._streams.values():
            q.put_nowait(GenerationOutput(finish_reason="abort", error=self.dead))
        if not self._stopping:
            log.error("%s; failed %d open requests", self.dead, len(self._streams))
            self._exit_report = loop.create_task(self._log_exit_code())  # held: a bare task may be collected

    async def _log_exit_code(self) -> None:
        """The exit code, once the process is reaped (off the event loop: that may take a moment)."""
        await asyncio.to_thread(self._proc.join, 5)
        log.error("engine process exit code: %s", self._proc.exitcode)

    def _send(self, msg: tuple) -> None:
        try:
            self._conn.send(msg)
        except (OSError, ValueError) as e:  # the child is gone; the reader reports it
            raise EngineError(self.dead or f"engine process is not reachable: {e}") from None

    async def shutdown(self) -> None:
        """Ask the child to stop (it fails what is left, sends that, exits); kill it if it hangs."""
        self._stopping = True
        self._ready = False
        if self._proc is None or not self._proc.is_alive():
            return
        try:
            self._conn.send(("stop",))
        except (OSError, ValueError):
            pass
        await asyncio.to_thread(self._proc.join, SHUTDOWN_TIMEOUT_S)
        if self._proc.is_alive():
            log.warning("engine process still running %.0f s after shutdown: killing it", SHUTDOWN_TIMEOUT_S)
            self._proc.kill()
            self._proc.join(5)

    async def generate(self, request_id: str, prompt_ids: list[int], params: SamplingParams):
        if not self.ready:
            raise EngineError(self.dead or "engine is not ready")
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = queue
        finished = False
        try:
            self._send(("add", request_id, list(prompt_ids), params))
            async for out in stream_outputs(queue):
                finished = out.finished
                yield out
        finally:
            del self._streams[request_id]
            if not finished and self.ready:  # client went away or was cancelled: free the slot
                self._send(("abort", request_id))


def child_main(args, conn: Connection, log_config: tuple[str | None, str]) -> None:
    """The engine process: build and start the native engine, then serve the pipe until the
    server says stop or goes away. Ctrl-C (and a supervisor's SIGTERM to the whole group)
    reaches this process too: the server decides when it stops, after draining."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log_format, log_level = log_config
    logging.basicConfig(format=log_format or logging.BASIC_FORMAT)
    logging.getLogger("specserve").setLevel(log_level.upper())
    side = _EngineSide(build_engine(args), conn)
    try:
        side.engine.start_blocking()
    except Exception as e:
        log.exception("engine failed to start")
        side.send(("failed", f"{type(e).__name__}: {e}"))
        return
    side.send(("ready", side.engine.info))
    side.serve()


class _EngineSide:
    """The engine process's end of the pipe: requests in, one message of deltas out per turn
    of the engine loop (the engine thread calls `flush`)."""

    def __init__(self, engine, conn: Connection):
        self.engine, self.conn = engine, conn
        self.outbox: collections.deque[tuple[str, GenerationOutput]] = collections.deque()
        self.sent_load = (0, 0)
        self.lock = threading.Lock()  # the engine thread and the pipe reader both send
        engine.flush = self.flush

    def send(self, msg: tuple) -> None:
        with self.lock:
            try:
                self.conn.send(msg)
            except (OSError, ValueError):  # the server is gone: `serve` sees it and stops
                pass

    def flush(self) -> None:
        batch = []
        while self.outbox:
            batch.append(self.outbox.popleft())
        load, dead = self.engine.load, self.engine.dead
        if batch or dead or load != self.sent_load:
            self.send(("out", batch, load, dead))
            self.sent_load = load

    def serve(self) -> None:
        try:
            while True:
                msg = self.conn.recv()
                if msg[0] == "add":
                    self._add(*msg[1:])
                elif msg[0] == "abort":
                    self.engine.abort(msg[1])
                else:
                    break
        except (EOFError, OSError):  # the server is gone
            pass
        self.engine.stop_blocking()
        self.flush()

    def _add(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        try:
            self.engine.submit(request_id, prompt_ids, params,
                               emit=lambda out: self.outbox.append((request_id, out)))
        except EngineError as e:
            self.send(("refused", request_id, isinstance(e, EngineOverloaded), str(e)))


def build_engine_process(args: NativeEngineArgs, log_format: str | None = None,
                         log_level: str = "info") -> EngineProcess:
    """The native engine in a child process, as the server runs it."""
    return EngineProcess(args, engine_info(args), log_format=log_format, log_level=log_level)
