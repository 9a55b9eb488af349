"""Lab engine mimic mode: answer like vLLM, SGLang, TGI, Triton/TensorRT-LLM, Ark or OpenAI.

``python -m chaoslib_infer.lab.engine --profile tgi`` (any ``--profile``, ``vllm`` included, or
``CHAOS_INFER_ENGINE_API_KEY`` set) wraps the simulated engine in
:class:`MimicMiddleware`, an ASGI middleware that changes what a client sees, following the
profile's data in :mod:`chaoslib_infer.providers` (sources there and in ``docs/certification.md``):

* **routes**: the profile's chat / completions / models / health / metrics routes are served
  (Ark's under ``/api/v3``, so a target URL ``http://127.0.0.1:PORT/api/v3`` reads like
  ``https://ark.cn-beijing.volces.com/api/v3``); any other path gets a 404 in the profile's error
  shape. ``/admin/faults`` (lab control plane) stays.
* **auth**: with ``CHAOS_INFER_ENGINE_API_KEY`` set in the engine's environment (never a
  command-line flag), completion and model routes need ``Authorization: Bearer <key>``; a missing
  or wrong key gets the profile's own 401 (``Profile.unauthorized``). Profiles whose server checks
  no key (Triton's frontend) ignore it. Health and metrics routes are never guarded.
* **error bodies**: the engine's OpenAI-style errors are rewritten into the profile's shape
  (``openai``, ``flat``, ``tgi``, ``detail``); TGI answers validation errors with 422.
* **streams**: the engine's role-only first chunk is given ``content: ""`` (vLLM, SGLang, Triton,
  OpenAI) or dropped, the role then riding on every content delta (TGI, Ark); an error event
  inside a stream takes the profile's stream error shape.
* **Ark model check**: the ``model`` field must equal the engine's ``--model`` (the endpoint id),
  else 404 ``InvalidEndpointOrModel.NotFound``.

What is not mimicked: metric names (``/metrics`` keeps vLLM's names wherever a profile has the
route), TGI's finish reason riding on the last token (the sim sends a separate final chunk),
tokenisation, and each service's full parameter validation.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from chaoslib_infer.providers import Profile, get_profile
from chaoslib_infer.safety.redact import clip

__all__ = ["ENGINE_KEY_ENV", "MimicMiddleware", "profile_error", "served_prefix"]

#: Environment variable holding the key the (mimic) engine requires; unset: no auth.
ENGINE_KEY_ENV = "CHAOS_INFER_ENGINE_API_KEY"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_TGI_KIND = {400: "validation", 404: "validation", 422: "validation", 429: "overloaded",
             503: "overloaded", 500: "generation"}  # fmt: skip
_ARK_TYPE = {400: ("BadRequest", "InvalidParameter"), 401: ("Unauthorized", "AuthenticationError"),
             404: ("NotFound", "InvalidEndpointOrModel.NotFound"),
             429: ("TooManyRequests", "RateLimitExceeded.EndpointRPMExceeded"),
             500: ("InternalServiceError", "InternalServiceError"),
             503: ("ServiceUnavailable", "ServerOverloaded")}  # fmt: skip
_OPENAI_TYPE = {400: "invalid_request_error", 401: "invalid_request_error", 404:
                "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
                503: "service_unavailable_error"}  # fmt: skip


def served_prefix(profile: Profile) -> str:
    """Path prefix the mimic serves the profile's routes under (``/api/v3`` for Ark)."""
    return "/api/v3" if profile.name == "ark" else ""


def profile_error(profile: Profile, status: int, message: str, stream: bool = False
                  ) -> tuple[int, dict[str, Any]]:  # fmt: skip
    """The ``(status, body)`` ``profile`` answers an error with.

    Args:
        profile: the profile mimicked.
        status: the engine's status (TGI turns 400 into 422).
        message: the engine's message.
        stream: shape of an error event inside a stream instead of an HTTP body.
    """
    shape = profile.stream_error_shape if stream else profile.error_shape
    if shape == "tgi":
        status = 422 if status == 400 else status
        return status, {"error": message, "error_type": _TGI_KIND.get(status, "generation")}
    if shape == "flat":
        etype = "BadRequestError" if status < 500 else "InternalServerError"
        return status, {"object": "error", "message": message, "type": etype, "param": None,
                        "code": status}  # fmt: skip
    if shape == "detail":
        return status, {"detail": message}
    if profile.name == "ark":
        etype, code = _ARK_TYPE.get(status, ("InternalServiceError", "InternalServiceError"))
        return status, {"error": {"code": code, "message": message, "param": "", "type": etype}}
    if profile.name == "openai":
        etype = _OPENAI_TYPE.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        return status, {"error": {"message": message, "type": etype, "param": None,
                                  "code": None}}  # fmt: skip
    etype = "BadRequestError" if status < 500 else "InternalServerError"
    return status, {"error": {"message": message, "type": etype, "param": None, "code": status}}


async def _json(send: Send, status: int, body: dict[str, Any] | None) -> None:
    data = b"" if body is None else json.dumps(body).encode()
    headers = [(b"content-length", str(len(data)).encode())]
    if body is not None:
        headers.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})


class MimicMiddleware:
    """ASGI middleware giving the sim engine one profile's surface (module docstring).

    Args:
        app: the engine app.
        profile: profile name (:data:`chaoslib_infer.providers.PROFILES`).
        api_key: key required on completion and model routes (None: no auth).
        model: the engine's model name (Ark: the endpoint id a request must name).
    """

    def __init__(self, app: ASGIApp, profile: str, api_key: str | None, model: str) -> None:
        self.app = app
        self.profile = get_profile(profile)
        self.api_key = api_key or None
        self.model = model
        p, pre = self.profile, served_prefix(self.profile)
        routes: dict[str, str] = {pre + p.chat_path: "/v1/chat/completions"}
        if p.completions_path:
            routes[pre + p.completions_path] = "/v1/completions"
        if p.models_path:
            routes[pre + p.models_path] = "/v1/models"
        for h in p.health_paths:
            routes[h] = "/health"
        if p.metrics_path:
            routes[p.metrics_path] = "/metrics"
        routes["/admin/faults"] = "/admin/faults"
        self.routes = routes
        guarded = {"/v1/chat/completions", "/v1/completions"}
        if p.name != "tgi":  # TGI's /v1/models is an info route, outside its auth layer
            guarded.add("/v1/models")
        self.guarded = guarded

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Route, authenticate and rewrite one request (HTTP only; lifespan passes through)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        p = self.profile
        inner = self.routes.get(scope["path"].rstrip("/") or "/")
        if inner is None:
            status, body = profile_error(p, 404, f"route {scope['path']} not found")
            await _json(send, status, body)
            return
        if self.api_key and p.unauthorized is not None and inner in self.guarded:
            want = f"{p.auth_scheme} {self.api_key}".encode()
            got = dict(scope["headers"]).get(b"authorization", b"")
            if got != want:
                await _json(send, p.unauthorized[0], p.unauthorized[1])
                return
        if p.name == "ark" and inner == "/v1/chat/completions":
            receive, model = await self._buffer(receive)
            if model != self.model:
                status, body = profile_error(
                    p, 404, f"The model or endpoint {model} does not exist or you do not have "
                    "access to it.",
                )  # fmt: skip
                await _json(send, status, body)
                return
        scope = dict(scope)
        scope["path"] = inner
        scope["raw_path"] = inner.encode()
        state: dict[str, Any] = {"status": 200, "kind": None, "buf": b"", "headers": []}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                ctype = dict(message.get("headers", [])).get(b"content-type", b"")
                state["status"] = message["status"]
                hdrs = message.get("headers", [])
                if any(k == b"x-chaos-shaped" for k, _ in hdrs):  # a provider's own error
                    message = {**message, "headers": [h for h in hdrs if h[0] != b"x-chaos-shaped"]}
                    await send(message)
                    return
                if message["status"] >= 400 and ctype.startswith(b"application/json"):
                    state["kind"] = "error"
                    state["headers"] = message.get("headers", [])
                    return  # sent with the rewritten body
                if ctype.startswith(b"text/event-stream"):
                    state["kind"] = "sse"
                await send(message)
                return
            if message["type"] == "http.response.body" and state["kind"] == "error":
                state["buf"] += message.get("body", b"")
                if message.get("more_body"):
                    return
                await self._send_error(send, state)
                return
            if message["type"] == "http.response.body" and state["kind"] == "sse":
                message = dict(message)
                message["body"] = self._rewrite_sse(message.get("body", b""))
            await send(message)

        await self.app(scope, receive, send_wrapper)

    async def _buffer(self, receive: Receive) -> tuple[Receive, str | None]:
        """Read the whole request body; return a replaying ``receive`` and the body's model."""
        chunks = []
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                break
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            model = json.loads(body).get("model")
        except (ValueError, AttributeError):
            model = None
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay, model if isinstance(model, str) else None

    async def _send_error(self, send: Send, state: dict[str, Any]) -> None:
        try:
            err = json.loads(state["buf"]).get("error") or {}
            message = str(err.get("message") or "error")
        except (ValueError, AttributeError):
            message = clip(state["buf"].decode("utf-8", "replace"), 200)
        status, body = profile_error(self.profile, state["status"], message)
        data = json.dumps(body).encode()
        headers = [(k, v) for k, v in state["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(data)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data, "more_body": False})

    def _rewrite_sse(self, body: bytes) -> bytes:
        if not body:
            return body
        out = []
        for event in body.split(b"\n\n"):
            if not event.startswith(b"data: {"):
                out.append(event)
                continue
            try:
                obj = json.loads(event[6:].decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                out.append(event)  # a garbled fault: bytes pass through untouched
                continue
            new = self._rewrite_event(obj)
            if new is not None:
                out.append(b"data: " + json.dumps(new, ensure_ascii=False).encode())
        return b"\n\n".join(out)

    def _rewrite_event(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        p = self.profile
        err = obj.get("error")
        if isinstance(err, dict):
            return profile_error(p, 500, str(err.get("message") or "error"), stream=True)[1]
        choices = obj.get("choices")
        if obj.get("object") != "chat.completion.chunk" or not isinstance(choices, list):
            return obj
        for choice in choices:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            role_only = set(delta) == {"role"}
            if role_only and p.role_chunk == "none":
                return None
            if role_only and p.role_chunk == "role+empty":
                delta["content"] = ""
            if not role_only and p.role_chunk == "none" and "content" in delta:
                delta["role"] = "assistant"
        return obj
