"""The messages between the server and the native engine's process (engine/process.py),
pickled over a multiprocessing pipe: one type per kind, so both ends dispatch on the type and
read fields by name.

  server -> engine
    Submit(request_id, prompt_ids, params)  a new request
    Abort(request_id)                       the client left or the deadline passed: free the slot
    Stop()                                  shut down: the engine fails what is left, sends it, exits
  engine -> server
    Ready(info) | Failed(reason)            once, when loading ends (info: what the engine filled in)
    Outputs(deltas, load)                   per engine loop turn with news: each request's new deltas,
                                            and (running, waiting)
    Refused(request_id, code, message)      a Submit the engine would not queue (engine.api.ErrorCode)
    Dead(reason)                            once, when the engine thread has died or stopped; sent
                                            before the last deltas of the requests it fails
    Compiles(status)                        the decode shapes compiled, compiling and eager, at each
                                            change while a worker compiles them (may come before Ready)
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.api import EngineInfo, ErrorCode, GenerationOutput, SamplingParams


@dataclass(frozen=True)
class Submit:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams


@dataclass(frozen=True)
class Abort:
    request_id: str


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Ready:
    info: EngineInfo


@dataclass(frozen=True)
class Failed:
    reason: str


@dataclass(frozen=True)
class Outputs:
    deltas: list[tuple[str, GenerationOutput]]  # (request_id, delta), in the order they were made
    load: tuple[int, int]


@dataclass(frozen=True)
class Refused:
    request_id: str
    code: ErrorCode
    message: str


@dataclass(frozen=True)
class Dead:
    reason: str


@dataclass(frozen=True)
class Compiles:
    status: dict   # engine.background_compile.CompileStatus.as_dict()


ToEngine = Submit | Abort | Stop
ToServer = Ready | Failed | Outputs | Refused | Dead | Compiles
