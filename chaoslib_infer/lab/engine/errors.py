"""The ``http_error`` fault mode's answers: the HTTP errors providers really send.

A request the fault picks is answered at once, before admission and without a generation (no
``generation`` line in the ledger, so a retry of it is a new request, never a duplicate), with one
of :data:`PROVIDER_ERRORS` (the fault's ``how``) in the error shape of a provider profile
(``profile``, else the engine's own ``--profile``, else vLLM's: :func:`answer`):

============== ====== =============================================================== =========
``how``        status what it stands for                                                retryable
============== ====== =============================================================== =========
rate_limit     429    a rate limit (OpenAI ``rate_limit_exceeded``, Ark                yes
                      ``RateLimitExceeded.EndpointRPMExceeded``), ``Retry-After`` sent
unavailable    503    overloaded / temporarily unavailable, ``Retry-After`` sent        yes
server_error   500    an internal error                                                 yes
closed_endpoint 400   Ark's ``InvalidEndpoint.ClosedEndpoint``: the endpoint is closed  yes
                      for now (scaled to zero, reopening): a 400 a client must retry
bad_request    400    a malformed request (``InvalidParameter``): final, never retry    no
============== ====== =============================================================== =========

``retry_after`` (whole seconds, RFC 9110 delay-seconds; 0: no header) rides on the 429 and 503
answers. The response carries :data:`SHAPED_HEADER` so the mimic middleware
(:mod:`chaoslib_infer.lab.mimic`) leaves the already shaped body alone.

Sources: Ark error codes https://www.volcengine.com/docs/82379/1299023 (429 TooManyRequests /
RateLimitExceeded.EndpointRPMExceeded, 400 InvalidEndpoint.ClosedEndpoint, 500
InternalServiceError, 503 ServiceUnavailable); OpenAI https://platform.openai.com/docs/guides/
error-codes (429, 500, 503).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from chaoslib_infer.lab.engine.faults import FaultSpec

__all__ = ["PROVIDER_ERRORS", "SHAPED_HEADER", "ProviderError", "answer", "error_of"]

#: Response header marking an error body already in a provider's shape (left alone by the mimic).
SHAPED_HEADER = "x-chaos-shaped"


@dataclass(frozen=True)
class ProviderError:
    """One error a provider answers.

    Attributes:
        status: HTTP status.
        message: the error's message.
        code: the provider's error code where its shape has one (Ark's dotted codes; None: the
            shape's default for the status).
        retryable: whether the provider means "try again" (documented by the provider).
        retry_after: the answer carries ``Retry-After`` (when the fault's ``retry_after`` > 0).
    """

    status: int
    message: str
    code: str | None
    retryable: bool
    retry_after: bool


#: The fault's ``how`` -> the error answered (module docstring).
PROVIDER_ERRORS: dict[str, ProviderError] = {
    "rate_limit": ProviderError(
        429, "Rate limit reached for requests: retry after the delay.",
        "RateLimitExceeded.EndpointRPMExceeded", True, True,
    ),
    "unavailable": ProviderError(
        503, "The service is temporarily unavailable: overloaded.", "ServiceUnavailable",
        True, True,
    ),
    "server_error": ProviderError(
        500, "The server had an error while processing your request.", "InternalServiceError",
        True, False,
    ),
    "closed_endpoint": ProviderError(
        400, "The endpoint is closed for now; retry later.", "InvalidEndpoint.ClosedEndpoint",
        True, False,
    ),
    "bad_request": ProviderError(
        400, "A parameter specified in the request is not valid.", "InvalidParameter",
        False, False,
    ),
}  # fmt: skip


def error_of(spec: FaultSpec) -> ProviderError:
    """The :class:`ProviderError` an ``http_error`` fault answers (its ``how``)."""
    return PROVIDER_ERRORS[str(spec.params.get("how") or "rate_limit")]


def answer(spec: FaultSpec, engine_profile: str | None) -> tuple[Response, dict[str, Any]]:
    """The response to a request an ``http_error`` fault picked, and what it was (ledger fields).

    Args:
        spec: the fault (``how``, ``retry_after`` seconds, ``profile``).
        engine_profile: the engine's ``--profile`` (None: the plain engine, vLLM's shape).

    Returns:
        ``(response, facts)``: ``facts`` is ``{"status", "code", "retryable", "retry_after_s"
        (None without the header), "profile"}``, for the engine ledger's ``fault`` line.
    """
    from chaoslib_infer.lab.mimic import profile_error
    from chaoslib_infer.providers import get_profile

    err = error_of(spec)
    name = str(spec.params.get("profile") or engine_profile or "vllm")
    profile = get_profile(name)
    status, body = profile_error(profile, err.status, err.message)
    inner = body.get("error")
    if isinstance(inner, dict) and err.code is not None and profile.name == "ark":
        inner["code"] = err.code
    elif isinstance(inner, dict) and profile.name == "openai" and err.status == 429:
        inner["code"] = "rate_limit_exceeded"
    elif isinstance(inner, dict) and err.status == 400 and isinstance(inner.get("code"), int):
        inner["code"] = err.code  # the condition's own code where the shape has a code slot
    headers = {SHAPED_HEADER: "1"}
    seconds = int(spec.params.get("retry_after") or 0)
    if err.retry_after and seconds > 0:
        headers["Retry-After"] = str(seconds)
    data = json.dumps(body).encode()
    response = Response(data, status_code=status, headers=headers, media_type="application/json")
    facts = {
        "status": status,
        "code": err.code,
        "retryable": err.retryable,
        "retry_after_s": seconds if "Retry-After" in headers else None,
        "profile": profile.name,
    }
    return response, facts
