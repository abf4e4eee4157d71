"""The native engine in its own process, the layout SGLang and vLLM serve with.

In one process the engine thread and the HTTP event loop share a GIL: each streamed token's
event-loop work (a few hundred microseconds of Python on CPU) stalls the next decode step,
and a crash in the engine takes the server down. Here `NativeEngine` runs in a spawned
child; the server process keeps HTTP, templates and the tokenizer, and the two exchange small
pickled messages over a pipe (engine/messages.py: which, who sends them and when).

If the child dies, every open request ends with an error and /health reports the engine dead.
While a worker compiles the decode steps in the background the child forwards each change of which
shapes are compiled (`compile_status`, shown by /health).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import multiprocessing
import signal
import threading
from multiprocessing.connection import Connection

from engine.api import (
    SHUTDOWN_TIMEOUT_S,
    EngineError,
    EngineInfo,
    ErrorCode,
    GenerationOutput,
    SamplingParams,
    stream_outputs,
)
from engine.loading import NativeEngineArgs, build_engine, engine_info
from engine.messages import (
    Abort,
    Compiles,
    Dead,
    Failed,
    Outputs,
    Ready,
    Refused,
    Stop,
    Submit,
    ToEngine,
    ToServer,
)

log = logging.getLogger("specserve.engine")


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
        self.compile_status: dict | None = None   # engine.scheduler.NativeEngine.compile_status, as last sent
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
        first = await asyncio.to_thread(self._first_message)
        if isinstance(first, Failed):
            self._proc.join(5)
            raise EngineError(first.reason)
        self.info = first.info
        asyncio.get_running_loop().add_reader(self._conn.fileno(), self._on_readable)
        self._ready = True

    def _first_message(self) -> Ready | Failed:
        """Wait for the child's Ready or Failed (loading can take minutes: weights, compiles)."""
        while True:
            while not self._conn.poll(0.5):
                if not self._proc.is_alive():
                    break
                if self._stopping:
                    return Failed("server stopped while the engine was loading")
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                self._proc.join(5)
                return Failed(f"engine process exited with code {self._proc.exitcode} while loading")
            if not isinstance(msg, Compiles):
                return msg
            self.compile_status = msg.status

    def _on_readable(self) -> None:
        """Event-loop reader: hand every message the child has sent to its request's queue."""
        try:
            while self._conn.poll():
                match self._conn.recv():
                    case Outputs(deltas=deltas, load=load):
                        for request_id, out in deltas:
                            if (q := self._streams.get(request_id)) is not None:
                                q.put_nowait(out)
                        self._load = load
                    case Refused(request_id=request_id, code=code, message=message):
                        if (q := self._streams.get(request_id)) is not None:
                            q.put_nowait(EngineError(message, code))
                    case Dead(reason=reason):
                        self.dead = self.dead or reason
                    case Compiles(status=status):
                        self.compile_status = status
        except (EOFError, OSError):
            self._child_gone()

    def _child_gone(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._conn.fileno())
        self.dead = "engine has shut down" if self._stopping else "engine process died"
        for q in self._streams.values():
            q.put_nowait(GenerationOutput(finish_reason="abort", error=self.dead,
                                          error_code=ErrorCode.ENGINE_UNAVAILABLE))
        if not self._stopping:
            log.error("%s; failed %d open requests", self.dead, len(self._streams))
            self._exit_report = loop.create_task(self._log_exit_code())  # held: a bare task may be collected

    async def _log_exit_code(self) -> None:
        """The exit code, once the process is reaped (off the event loop: that may take a moment)."""
        await asyncio.to_thread(self._proc.join, 5)
        log.error("engine process exit code: %s", self._proc.exitcode)

    def _send(self, msg: ToEngine) -> None:
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
            self._conn.send(Stop())
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
            self._send(Submit(request_id, list(prompt_ids), params))
            async for out in stream_outputs(queue):
                finished = out.finished
                yield out
        finally:
            del self._streams[request_id]
            if not finished and self.ready:  # client went away or was cancelled: free the slot
                self._send(Abort(request_id))


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
        side.send(Failed(f"{type(e).__name__}: {e}"))
        return
    side.send(Ready(side.engine.info))
    side.serve()


class _EngineSide:
    """The engine process's end of the pipe: requests in, one message of deltas out per turn
    of the engine loop (the engine thread calls `flush`)."""

    def __init__(self, engine, conn: Connection):
        self.engine, self.conn = engine, conn
        self.outbox: collections.deque[tuple[str, GenerationOutput]] = collections.deque()
        self.sent_load = (0, 0)
        self.sent_dead = False
        self.lock = threading.Lock()  # the engine thread, the pipe reader and the compile loader send
        engine.flush = self.flush
        engine.on_compile_news = lambda status: self.send(Compiles(status))

    def send(self, msg: ToServer) -> None:
        with self.lock:
            try:
                self.conn.send(msg)
            except (OSError, ValueError):  # the server is gone: `serve` sees it and stops
                pass

    def flush(self) -> None:
        batch = []
        while self.outbox:
            batch.append(self.outbox.popleft())
        if self.engine.dead is not None and not self.sent_dead:  # first: the server stops taking requests
            self.send(Dead(self.engine.dead))
            self.sent_dead = True
        load = self.engine.load
        if batch or load != self.sent_load:
            self.send(Outputs(batch, load))
            self.sent_load = load

    def serve(self) -> None:
        try:
            while True:
                match self.conn.recv():
                    case Submit() as submit:
                        self._submit(submit)
                    case Abort(request_id=request_id):
                        self.engine.abort(request_id)
                    case Stop():
                        break
        except (EOFError, OSError):  # the server is gone
            pass
        self.engine.stop_blocking()
        self.flush()

    def _submit(self, m: Submit) -> None:
        try:
            self.engine.submit(m.request_id, m.prompt_ids, m.params,
                               emit=lambda out: self.outbox.append((m.request_id, out)))
        except EngineError as e:
            self.send(Refused(m.request_id, e.code, str(e)))


def build_engine_process(args: NativeEngineArgs, log_format: str | None = None,
                         log_level: str = "info") -> EngineProcess:
    """The native engine in a child process, as the server runs it."""
    return EngineProcess(args, engine_info(args), log_format=log_format, log_level=log_level)
