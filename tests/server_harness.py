"""Live servers for the tests/test_server_*.py files.

Built once per test process (module-level cache, so every server test file shares them):
a tiny random Llama target, its greedy continuations of the test prompts (from the native
engine itself), an EAGLE-3 drafter fitted on those continuations (so acceptance is real,
not random), and uvicorn servers running `create_app` in threads on free ports:
  plain_server()  the target alone (no speculation), engine in a thread (native_engine)
  spec_server()   target + fitted drafter, 3 steps, engine in its own process (process_engine),
                  as `python -m server` runs it
Torch is limited to one thread: on a shared 2-core machine, tiny matmuls on two threads
run ~15x slower than on one.
"""
from __future__ import annotations

import asyncio
import atexit
import functools
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.server_proc import free_port

MAX_TOKENS = 24
STEPS = 3
MAX_BODY_BYTES = 1 << 20
API_KEY = "test-key-0123456789"

COMPLETION_PROMPTS = [
    "def foo(x):", "import os", "class Point:", "for i in range(10):", "return self.value", "# a comment",
    "while True:", "print('hello')", "x = [1, 2, 3]", "if __name__ == '__main__':", "try:",
    "with open(path) as f:", "raise ValueError", "lambda x: x + 1", "yield from items", "assert a == b",
]
CHAT_PROMPTS = ["Write a function.", "What is a list?", "Explain the import system.", "Say hello."]


@dataclass
class TinyModels:
    root: Path
    target: Path
    draft: Path
    tokenizer: object
    greedy: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (kind, prompt) -> output ids

    def chat_ids(self, content: str) -> list[int]:
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                  add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def completion_ids(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt)


@dataclass
class LiveServer:
    url: str
    model: str
    engine: object
    server: object
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        if self in _SERVERS:
            _SERVERS.remove(self)

    def wait_healthy(self, timeout: float = 120) -> "LiveServer":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.thread.is_alive(), "server thread died"
            try:
                r = httpx.get(self.url + "/health", timeout=5)
            except httpx.HTTPError:
                time.sleep(0.05)
                continue
            if r.status_code == 200:
                return self
            assert r.json().get("status") != "dead", f"engine failed to start: {r.json().get('error')}"
            time.sleep(0.05)
        raise AssertionError(f"{self.url} not healthy after {timeout}s")


def stream_in_background(url: str, output, max_tokens: int = 400, headers: dict | None = None,
                         **body) -> tuple[list[str], threading.Thread]:
    """A greedy streamed completion of `max_tokens` (past EOS) in a thread, for shutdown tests:
    returns its SSE data lines, growing as they arrive, and the thread once the first line has
    come (the request is in flight). A connection the server cuts ends the stream quietly;
    `output()` (the server's log) explains a stream that never started."""
    chunks, first = [], threading.Event()

    def stream():
        try:
            with httpx.stream("POST", url + "/v1/completions", headers=headers, timeout=120, json={
                    "prompt": "import os\n", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                    "stream": True, **body}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        chunks.append(line.removeprefix("data: "))
                        first.set()
        except httpx.HTTPError:
            pass  # the cut connection
    t = threading.Thread(target=stream, daemon=True)
    t.start()
    assert first.wait(60), output()[-3000:]
    return chunks, t


def start_server(engine, wait: bool = True, **app_kwargs) -> LiveServer:
    """uvicorn serving create_app(engine, **app_kwargs) in a daemon thread on a free port."""
    import uvicorn

    from server.app import create_app

    app_kwargs.setdefault("max_body_bytes", MAX_BODY_BYTES)
    app = create_app(engine, **app_kwargs)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    live = LiveServer(f"http://127.0.0.1:{port}", app.state.ctx.model_name, engine, server, thread)
    _SERVERS.append(live)
    return live.wait_healthy() if wait else live


def engine_args(models: TinyModels, speculative: bool, **kw):
    from engine.decoder import SpecConfig
    from engine.loading import NativeEngineArgs
    return NativeEngineArgs(model=str(models.target), draft=str(models.draft) if speculative else None,
                            spec=SpecConfig(STEPS) if speculative else None, device="cpu", **kw)


def native_engine(models: TinyModels, speculative: bool, **kw):
    """The native engine in a thread of this process (tests can wrap its decoder)."""
    from engine.loading import build_engine
    return build_engine(engine_args(models, speculative, **kw))


def process_engine(models: TinyModels, speculative: bool, **kw):
    """The same engine in a child process (engine/process.py), one torch thread there too."""
    from engine.process import build_engine_process
    return build_engine_process(engine_args(models, speculative, cpu_threads=1, **kw), log_level="warning")


_SERVERS: list[LiveServer] = []
_PLAIN: list[LiveServer] = []


@functools.cache
def models() -> TinyModels:
    import torch
    from transformers import AutoTokenizer

    from models.llama import load_target
    from tests.tiny import export_drafter, fit_drafter, make_target_dir, random_drafter

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="specserve-server-tests-"))
    atexit.register(shutil.rmtree, root, True)
    m = TinyModels(root, make_target_dir(root / "target"), root / "draft", None)
    m.tokenizer = AutoTokenizer.from_pretrained(m.target)
    prompts = {("completion", p): m.completion_ids(p) for p in COMPLETION_PROMPTS}
    prompts |= {("chat", p): m.chat_ids(p) for p in CHAT_PROMPTS}
    _PLAIN.append(start_server(native_engine(m, speculative=False)))
    m.greedy = asyncio.run(_greedy(_PLAIN[0].engine, prompts, MAX_TOKENS + 8))
    target = load_target(m.target)
    sequences = [prompts[k] + m.greedy[k] for k in prompts]
    export_drafter(fit_drafter(target, random_drafter(target), sequences, steps=300), m.draft)
    return m


async def _greedy(engine, prompts: dict, max_tokens: int) -> dict:
    """The target's own greedy continuations, from the no-speculation engine."""
    from engine.api import SamplingParams

    async def one(i, key):
        ids = []
        params = SamplingParams(max_tokens=max_tokens, temperature=0)
        async for out in engine.generate(f"fit-{i}", prompts[key], params):
            ids += out.token_ids
        return key, ids
    return dict(await asyncio.gather(*(one(i, k) for i, k in enumerate(prompts))))


def plain_server() -> LiveServer:
    models()
    return _PLAIN[0]


@functools.cache
def spec_server() -> LiveServer:
    return start_server(process_engine(models(), speculative=True))


def stop_all() -> None:
    """Stop every server (call when the pytest run ends: at interpreter exit the engines cannot shut
    down cleanly any more, their executor threads are gone)."""
    while _SERVERS:
        _SERVERS[-1].stop()


atexit.register(stop_all)
