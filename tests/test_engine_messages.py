"""Every message between the server and the engine process (engine/messages.py) crosses a real
pipe to a spawned process, as engine/process.py runs it, and comes back equal: the types
pickle and unpickle on both sides, nested engine.api values and ErrorCode included."""
from __future__ import annotations

import multiprocessing
import typing

from engine.api import EngineInfo, ErrorCode, GenerationOutput, SamplingParams, SpecStats
from engine.messages import Abort, Compiles, Dead, Failed, Outputs, Ready, Refused, Stop, Submit, ToEngine, ToServer

SAMPLES = [
    Submit("r1", [5, 6, 7], SamplingParams(max_tokens=8, temperature=0.7, stop=["\n"], seed=3)),
    Abort("r1"),
    Stop(),
    Ready(EngineInfo(engine="native", model="tiny", max_context=256, speculative=True, steps=3, extra={"k": "v"})),
    Failed("RuntimeError: no weights"),
    Outputs([("r1", GenerationOutput(text="hi", token_ids=[1, 2], spec_step=SpecStats.of_step(3, 2))),
             ("r2", GenerationOutput(finish_reason="abort", error="engine failed",
                                     error_code=ErrorCode.ENGINE_UNAVAILABLE))], (1, 2)),
    Refused("r3", ErrorCode.OVERLOADED, "server is overloaded: 1 requests waiting"),
    Dead("engine has shut down"),
    Compiles({"compiled": ["1 row x 3 draft steps"], "compiling": ["2 rows x 1 draft steps"], "eager": []}),
]


def echo(conn) -> None:
    while (msg := conn.recv()) is not None:
        conn.send(msg)


def test_every_message_type_round_trips_through_the_engine_pipe():
    assert {type(m) for m in SAMPLES} == set(typing.get_args(ToEngine)) | set(typing.get_args(ToServer))
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=echo, args=(theirs,), daemon=True)
    child.start()
    try:
        for msg in SAMPLES:
            ours.send(msg)
            assert ours.poll(30), f"no echo of {msg!r}"
            back = ours.recv()
            assert type(back) is type(msg) and back == msg
            if isinstance(msg, Refused):  # a str enum equals its value: check it is still the member
                assert back.code is ErrorCode.OVERLOADED
    finally:
        ours.send(None)
        child.join(10)
