"""API-key check for the OpenAI routes (pure ASGI middleware, so it runs before any body is read).

With a key configured, every /v1/* request needs `Authorization: Bearer <key>`; the compare
is constant-time (hmac.compare_digest). /health and /metrics stay open for load balancers
and Prometheus. A key in the query string is never read (it would end up in access logs).
"""
from __future__ import annotations

import hmac

from server.errors import APIError

PROTECTED_PREFIX = "/v1/"


class ApiKeyMiddleware:
    def __init__(self, app, api_key: str | None):
        self.app = app
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if self.key is None or scope["type"] != "http" or not scope["path"].startswith(PROTECTED_PREFIX):
            return await self.app(scope, receive, send)
        header = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            err = APIError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})
        elif not hmac.compare_digest(token.strip(), self.key):
            err = APIError(401, "invalid API key", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        else:
            return await self.app(scope, receive, send)
        await err.response()(scope, receive, send)
