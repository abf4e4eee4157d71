"""Read a JSON request body into a request model, with an error for each way it can be wrong.

Read by hand instead of as a FastAPI body parameter so that each failure gets its own 400
(or 413) message in OpenAI's shape: oversized body, invalid UTF-8, malformed JSON, not an
object, then field validation. The size limit is enforced while reading, so a client cannot
make the server buffer more than `max_bytes` whatever Content-Length says.
"""
from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from server.errors import APIError, from_validation_errors

M = TypeVar("M", bound=BaseModel)


async def read_request(request: Request, model: type[M], max_bytes: int) -> M:
    raw = await read_body(request, max_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(400, f"request body is not valid UTF-8 (byte {e.start})", code="invalid_body") from None
    try:
        obj = json.loads(text)
    except ValueError as e:  # JSONDecodeError, and integers longer than Python's 4300-digit limit
        raise APIError(400, f"request body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:
        raise APIError(400, "request body is nested too deeply", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise from_validation_errors(e.errors()) from None


async def read_body(request: Request, max_bytes: int) -> bytes:
    too_big = APIError(413, f"request body is larger than the server's limit of {max_bytes} bytes",
                       code="body_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)
