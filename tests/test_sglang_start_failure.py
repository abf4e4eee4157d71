"""A scheduler that fails while SGLang loads sends SIGQUIT to its parent (sglang 0.5.23
managers/scheduler.py, run_scheduler_process); our server builds sglang.Engine in a thread, where
SGLang installs no handler, so without ours that signal kills the server. With ours the server
exits with its clean "failed to start" (status 1) and the schedulers are gone.

The stand-in is only the part of sglang.Engine that launches scheduler processes and waits for
their ready message; the signal, the handler, the server and its exit are the real ones."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STANDIN = r'''
import multiprocessing as mp, os, signal, sys, threading, time

# As a server started from a shell has it: SIGQUIT at its default action, not blocked (a test
# runner's worker may pass on an ignored or blocked SIGQUIT, as a CI run once did).
signal.signal(signal.SIGQUIT, signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGQUIT})

def scheduler(fails):
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1), os.dup2(null, 2)  # the test reads our output to its end, not theirs
    if fails:  # what sglang's scheduler does with an exception while loading
        os.kill(os.getppid(), signal.SIGQUIT)
    time.sleep(600)  # a rank that never reports ready (stuck in a collective)

def launch_schedulers(**server_args):
    ctx = mp.get_context("fork")
    readers = []
    for rank in range(2):
        r, w = ctx.Pipe(duplex=False)
        p = ctx.Process(target=scheduler, args=(rank == 1,), daemon=True)
        p.start()
        w.close()
        os.write(1, f"scheduler {p.pid}\n".encode())  # one write: the SIGQUIT may come mid-print
        readers.append(r)
    readers[0].recv()  # waits for rank 0's ready message, as sglang.Engine does

if sys.argv[1] == "bare":  # no SGLangEngine: the signal meets the default action
    t = threading.Thread(target=launch_schedulers, daemon=True)
    t.start()
    t.join(30)
    print("survived", flush=True)
else:
    from server.engines.sglang_engine import SGLangEngine
    from server.main import serve
    engine = SGLangEngine({"model_path": "/models/t"}, engine_factory=launch_schedulers,
                          tokenizer_loader=lambda path, trust: object())
    serve(engine, port=int(sys.argv[2]), log_level="warning")
'''


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", STANDIN, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z"


def schedulers(r: subprocess.CompletedProcess) -> list[int]:
    return [int(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("scheduler")]


def test_without_a_handler_the_schedulers_sigquit_kills_the_process():
    r = run("bare")
    for pid in schedulers(r):  # orphans of the killed process
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert r.returncode == -signal.SIGQUIT and "survived" not in r.stdout, (r.returncode, r.stdout, r.stderr)


def test_a_scheduler_failing_at_start_gives_the_clean_start_failure():
    from tests.server_harness import free_port
    r = run("serve", str(free_port()))
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "engine failed to start" in r.stderr and "SIGQUIT" in r.stderr, r.stderr[-2000:]
    pids = schedulers(r)
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while not all(gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(gone(p) for p in pids), "the schedulers outlived the server"
