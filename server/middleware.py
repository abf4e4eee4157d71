"""Request ids and the access log, as pure ASGI middleware (it must not buffer SSE streams).

Every request gets an id: a sane incoming `x-request-id` is honoured (so a gateway's id
follows the request), otherwise a fresh one is made. The id goes back in the `x-request-id`
header, into the response `id`, and into every log line about the request. When the response
is complete (streams included) one access-log line is written with the status, the token
counts and accept length the handler left in `scope["state"]["usage"]`, and the latency.
"""
from __future__ import annotations

import logging
import re
import time
import uuid

access_log = logging.getLogger("specserve.access")

QUIET_PATHS = ("/health", "/metrics")  # probes and scrapes: logged at DEBUG unless they fail
_SANE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def new_request_id() -> str:
    return uuid.uuid4().hex


def pick_request_id(incoming: bytes | None) -> str:
    if incoming:
        try:
            rid = incoming.decode("ascii")
        except UnicodeDecodeError:
            rid = ""
        if _SANE_ID.match(rid):
            return rid
    return new_request_id()


class RequestContextMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        incoming = next((v for k, v in scope.get("headers", []) if k == b"x-request-id"), None)
        rid = pick_request_id(incoming)
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        status = 0

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                message = {**message, "headers": headers + [(b"x-request-id", rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except BaseException:
            status = status or 500
            raise
        finally:
            usage = state.get("usage") or {}
            status = status or 499  # no response started: the client went away first
            quiet = scope["path"] in QUIET_PATHS and status == 200
            access_log.log(
                logging.DEBUG if quiet else logging.INFO,
                '[%s] %s "%s %s HTTP/%s" %d prompt_tokens=%s completion_tokens=%s accept_length=%s finish=%s '
                'latency_ms=%.1f', rid, _client(scope), scope["method"], scope["path"],
                scope.get("http_version", "1.1"), status, usage.get("prompt_tokens", "-"),
                usage.get("completion_tokens", "-"), _fmt(usage.get("accept_length")), usage.get("finish_reason", "-"),
                (time.perf_counter() - start) * 1000)


def _client(scope) -> str:
    c = scope.get("client")
    return f"{c[0]}:{c[1]}" if c else "-"


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.2f}"
