"""What the route handlers share: the engine, its start-up state, the metrics and the limits.

The engine starts in the background (app lifespan) so /health can answer while weights load:
loading -> 503 with Retry-After, ready -> 200, start failed or engine died -> 503 for good.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from typing import Callable

from engine.api import Engine
from server.errors import APIError
from server.metrics import ServerMetrics

log = logging.getLogger("specserve.server")

LOADING_RETRY_AFTER_S = "5"


@dataclass
class ServerContext:
    engine: Engine
    metrics: ServerMetrics
    served_model_name: str | None
    max_body_bytes: int
    request_timeout_s: float | None
    start_task: asyncio.Task | None = None
    start_error: str | None = None
    on_start_failure: Callable[[], None] | None = None  # e.g. stop the server process
    tool_call_parser: str | None = None   # SGLang's parser names (server/tools.py)
    reasoning_parser: str | None = None
    _ids: itertools.count = field(default_factory=itertools.count)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.engine.info.model

    @property
    def status(self) -> str:
        """ok | loading | dead."""
        if self.engine.ready:
            return "ok"
        if self.start_error is None and (self.start_task is None or not self.start_task.done()):
            return "loading"
        return "dead"

    @property
    def dead_reason(self) -> str:
        return self.start_error or getattr(self.engine, "dead", None) or "the engine is not running"

    async def start_engine(self) -> None:
        try:
            await self.engine.start()
            log.info("engine ready: %s", self.engine.info)
        except Exception as e:
            self.start_error = f"engine failed to start: {type(e).__name__}: {e}"
            log.exception("engine failed to start")
            if self.on_start_failure is not None:
                self.on_start_failure()

    def check_ready(self) -> None:
        status = self.status
        if status == "loading":
            raise APIError(503, "the model is still loading", code="engine_loading",
                           headers={"Retry-After": LOADING_RETRY_AFTER_S})
        if status == "dead":
            raise APIError(503, f"the engine is not available: {self.dead_reason}", code="engine_unavailable")

    def check_model(self, model: str | None) -> None:
        if model and model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist; this server serves `{self.model_name}`.",
                           param="model", code="model_not_found")

    def engine_request_id(self, request_id: str) -> str:
        """Unique per request even if clients reuse an x-request-id (the engine aborts by id)."""
        return f"{request_id}-{next(self._ids)}"
