"""ASGI shapes and OpenAI/vLLM-style error objects shared by the engine's modules (a leaf)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.responses import JSONResponse

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class RequestError(Exception):
    """A request that must be answered with an OpenAI-style error object."""

    def __init__(self, status: int, message: str) -> None:
        """Args: status: HTTP status code; message: human-readable message."""
        super().__init__(message)
        self.status = status
        self.message = message


_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    429: "RateLimitError",
    503: "ServiceUnavailableError",
}


def error_body(status: int, message: str) -> dict[str, Any]:
    """Build an OpenAI/vLLM-style error object.

    Args:
        status: HTTP status code (also used as ``code``).
        message: human-readable message.

    Returns:
        ``{"error": {"message", "type", "param", "code"}}``.
    """
    etype = _ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    return {"error": {"message": message, "type": etype, "param": None, "code": status}}


def error_response(status: int, message: str) -> JSONResponse:
    """A JSON response carrying :func:`error_body` with HTTP status ``status``."""
    return JSONResponse(error_body(status, message), status_code=status)


def sse(obj: dict[str, Any]) -> Message:
    """One server-sent event ``data: <compact JSON>\\n\\n`` as an ASGI body message (more_body)."""
    data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return {"type": "http.response.body", "body": f"data: {data}\n\n".encode(), "more_body": True}
