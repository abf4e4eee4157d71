"""create_app: the FastAPI application around one engine (any engine.api.Engine).

The lifespan starts the engine in the background, so the server accepts connections (and
answers /health with 503) while weights load, and shuts the engine down on exit.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Callable

from fastapi import FastAPI

from engine.api import Engine
from server.auth import ApiKeyMiddleware
from server.context import ServerContext
from server.errors import install_error_handlers
from server.metrics import ServerMetrics
from server.middleware import RequestContextMiddleware
from server.routes import router
from server.tools import check_parser_names

log = logging.getLogger("specserve.server")

DEFAULT_REQUEST_TIMEOUT_S = 600.0


def create_app(engine: Engine, *, api_key: str | None = None, served_model_name: str | None = None,
               launch_info: dict[str, str] | None = None, max_body_bytes: int = 8 << 20,
               request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S,
               on_start_failure: Callable[[], None] | None = None, tool_call_parser: str | None = None,
               reasoning_parser: str | None = None) -> FastAPI:
    """api_key: required as a Bearer token on /v1/* when set. served_model_name: the model id
    clients use (default: the engine's). launch_info: extra labels for specserve_launch_info.
    max_body_bytes: larger request bodies get 413. request_timeout_s: per-request wall-clock
    limit (None: none); past it the request is aborted and answered with 504.
    on_start_failure: called if the engine cannot start (without it, /health stays 503).
    tool_call_parser, reasoning_parser: SGLang's parser names for tool calls and reasoning
    (server/tools.py); an unknown name raises ParserSetupError here, before anything serves."""
    check_parser_names(tool_call_parser, reasoning_parser)
    ctx = ServerContext(engine=engine, metrics=ServerMetrics(engine, launch_info), served_model_name=served_model_name,
                        max_body_bytes=max_body_bytes, request_timeout_s=request_timeout_s,
                        on_start_failure=on_start_failure, tool_call_parser=tool_call_parser,
                        reasoning_parser=reasoning_parser)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        ctx.start_task = asyncio.create_task(ctx.start_engine())
        try:
            yield
        finally:
            if not ctx.start_task.done():
                ctx.start_task.cancel()
                with contextlib.suppress(BaseException):
                    await ctx.start_task
            try:
                await engine.shutdown()
            except Exception:
                log.exception("engine shutdown failed")

    app = FastAPI(title="specserve", summary="OpenAI-compatible server with EAGLE-3 speculative decoding",
                  lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.ctx = ctx
    app.state.created = time.time()
    install_error_handlers(app)
    app.include_router(router)
    app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    app.add_middleware(RequestContextMiddleware)  # added last = outermost: ids and logs cover auth failures
    return app
