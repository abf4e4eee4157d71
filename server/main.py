"""Run the server: `serve(engine, ...)`, called by the one launcher (launch/cli.py, which
`specserve`, launch/serve.sh and `python -m server` all run)."""
from __future__ import annotations

import logging

from server.app import DEFAULT_REQUEST_TIMEOUT_S, create_app

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0  # Kubernetes' default grace period before SIGKILL


def serve(engine, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          served_model_name: str | None = None, launch_info: dict[str, str] | None = None, log_level: str = "info",
          request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S, max_body_bytes: int = 8 << 20,
          shutdown_timeout_s: float | None = DEFAULT_SHUTDOWN_TIMEOUT_S, tool_call_parser: str | None = None,
          reasoning_parser: str | None = None) -> None:
    """Serve `engine` until SIGINT/SIGTERM; in-flight requests are drained before the engine
    stops, for at most `shutdown_timeout_s` (None: as long as they take), then cancelled.
    If the engine cannot start (weights, tokenizer, device), the process exits with status 1
    instead of answering 503 forever, so a supervisor sees the failure and can restart or alert."""
    import uvicorn

    configure_logging(log_level)
    server = None

    def stop() -> None:
        server.should_exit = True  # the graceful stop uvicorn runs on SIGTERM

    app = create_app(engine, api_key=api_key, served_model_name=served_model_name, launch_info=launch_info,
                     max_body_bytes=max_body_bytes, request_timeout_s=request_timeout_s, on_start_failure=stop,
                     tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser)
    # Our access log (server/middleware.py) replaces uvicorn's: it has the request id and tokens.
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level.lower(), access_log=False,
                                           timeout_graceful_shutdown=shutdown_timeout_s))
    server.run()
    if app.state.ctx.start_error:
        raise SystemExit(f"specserve: {app.state.ctx.start_error}")


def configure_logging(level: str) -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(format=LOG_FORMAT)
    logging.getLogger("specserve").setLevel(level.upper())
