"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

Every failure a client can see goes through `APIError` or one of the handlers installed here,
so FastAPI's defaults (422 with a list of details, {"detail": ...} for 404/405) never leak.
Status codes (documented for clients):
  400 invalid_request_error  validation, malformed JSON, invalid UTF-8, context exceeded
  401 invalid_request_error  missing or wrong API key (code invalid_api_key)
  404 invalid_request_error  unknown model (code model_not_found) or route
  405 invalid_request_error  wrong method for a route
  413 invalid_request_error  body larger than the server's limit
  499 -                      (access log only) the client went away before the response
  500 server_error           unexpected failure (the message names it; details in the log)
  503 server_error           overloaded (Retry-After), engine loading (Retry-After) or dead
  504 server_error           the request ran past the server's per-request timeout
A failure the engine reports carries an engine.api.ErrorCode; `engine_failure` is the one
place that turns it into a status.
"""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.api import ErrorCode

log = logging.getLogger("specserve.server")


class APIError(Exception):
    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None, type: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or {}
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# code -> (status, message prefix, headers)
_ENGINE_FAILURES = {
    ErrorCode.OVERLOADED: (503, "", {"Retry-After": "1"}),
    ErrorCode.ENGINE_UNAVAILABLE: (503, "engine unavailable: ", {}),
    ErrorCode.ENGINE_ERROR: (500, "engine error: ", {}),
    ErrorCode.TIMEOUT: (504, "", {}),
    ErrorCode.INVALID_REQUEST: (400, "", {}),
}


def engine_failure(code: ErrorCode, message: str) -> APIError:
    """The client's view of a failed request; the body's code is the ErrorCode's value."""
    status, prefix, headers = _ENGINE_FAILURES[code]
    param = None
    if code == ErrorCode.INVALID_REQUEST:  # "<field>: why" (a grammar that does not compile, ...)
        head = message.split(":", 1)[0]
        param = head if head.replace("_", "").replace(".", "").isalnum() else None
    return APIError(status, prefix + message, code=code.value, headers=dict(headers), param=param)


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "tuple"}


def _is_type_tag(part) -> bool:
    """pydantic adds union members to error locations: 'str', 'list[TextPart]', 'function-after[...]'."""
    return isinstance(part, str) and (part in _TYPE_TAGS or "[" in part or part.startswith(("function-", "tagged-")))


def loc_to_param(loc: tuple) -> str | None:
    """('body', 'messages', 0, 'content', 'str') -> 'messages[0].content'."""
    out = ""
    for part in loc:
        if part in ("body", "query", "path", "header") and not out:
            continue
        if _is_type_tag(part):
            break
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or None


def from_validation_errors(errors: list[dict]) -> APIError:
    """A 400 naming the first offending field; pydantic's wording for the message, plus the
    accepted types when the field takes several (str | list[int] ...)."""
    first = errors[0]
    param = loc_to_param(tuple(first.get("loc", ())))
    msg = first.get("msg", "invalid value").removeprefix("Value error, ")
    message = f"{param}: {msg}" if param else msg
    same = [e for e in errors if loc_to_param(tuple(e.get("loc", ()))) == param]
    tags = list(dict.fromkeys(_union_tag(e.get("loc", ())) for e in same if _union_tag(e.get("loc", ()))))
    if len(tags) > 1:
        message += f" (accepted: {', '.join(tags)})"
    others = len(errors) - len(same)
    if others:
        message += f" (and {others} more error{'s' if others > 1 else ''})"
    return APIError(400, message, param=param, code="invalid_value")


def _union_tag(loc) -> str | None:
    return next((p for p in loc if _is_type_tag(p) and not str(p).startswith(("function-", "tagged-"))), None)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        if exc.status >= 500:
            log.warning("[%s] %d %s", _rid(request), exc.status, exc.message)
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return from_validation_errors(list(exc.errors())).response()

    @app.exception_handler(ValidationError)
    async def _pydantic(request: Request, exc: ValidationError):
        return from_validation_errors(exc.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        messages = {404: f"no route {request.method} {request.url.path}",
                    405: f"method {request.method} not allowed for {request.url.path}"}
        message = messages.get(exc.status_code, str(exc.detail))
        return APIError(exc.status_code, message, headers=dict(exc.headers or {}),
                        code={404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("[%s] unhandled error", _rid(request))
        return APIError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error").response()


def _rid(request: Request) -> str:
    return request.scope.get("state", {}).get("request_id", "-")
