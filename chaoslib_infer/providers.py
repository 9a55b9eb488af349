"""Provider profiles: how each OpenAI-compatible inference service is called and how it fails.

One :class:`Profile` per service family the certification knows: vLLM, SGLang, TGI, TensorRT-LLM
behind Triton's OpenAI-compatible frontend, Volcano Engine Ark, and a generic OpenAI-compatible
endpoint. A profile is data: the routes relative to the target's base URL, the auth header, which
``stream_options`` the service accepts, the shape of its error bodies, whether it sends a role-only
first chunk, its health and metrics routes. The certification's load client uses it to build
requests (:func:`endpoint`, :func:`auth_headers`) and to read errors (:func:`parse_error`,
:func:`error_kind`); the lab engine's ``--profile`` mimic mode (``chaoslib_infer.lab.mimic``)
uses the same data to answer like each of them.

Every fact is taken from the service's own source or documentation; ``Profile.sources`` lists
where (also in ``docs/certification.md``).

Error body shapes (:data:`ERROR_SHAPES`):

- ``openai``: ``{"error": {"message", "type", "param", "code"}}`` (OpenAI; vLLM, where ``code`` is
  the HTTP status; Ark, where ``code`` is a dotted string such as
  ``RateLimitExceeded.EndpointRPMExceeded`` and ``type`` e.g. ``TooManyRequests``);
- ``flat``: ``{"object": "error", "message", "type", "param", "code"}`` (SGLang's HTTP errors;
  inside a stream SGLang nests the same object under ``"error"``);
- ``tgi``: ``{"error": "<message>", "error_type": "<kind>"}`` (TGI, also as an SSE event);
- ``detail``: ``{"detail": "<message>"}`` (FastAPI ``HTTPException``: Triton's OpenAI frontend).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from chaoslib_infer.safety.redact import clip

__all__ = [
    "ERROR_SHAPES",
    "PROFILES",
    "Profile",
    "auth_headers",
    "endpoint",
    "error_kind",
    "get_profile",
    "join",
    "parse_error",
]

#: Known error body shapes (module docstring).
ERROR_SHAPES: tuple[str, ...] = ("openai", "flat", "tgi", "detail")


@dataclass(frozen=True)
class Profile:
    """How one service family is called (routes relative to the target's base URL).

    Attributes:
        name: short name used in target files (``vllm``, ``sglang``, ``tgi``, ``trtllm``, ``ark``,
            ``openai``).
        title: human name.
        chat_path: chat completions route, appended to the base URL (after stripping a trailing
            ``/v1`` when the route starts with ``/v1``).
        completions_path: text completions route, or None when the service has none we use.
        models_path: model listing route, or None.
        health_paths: health routes (empty for managed services: none is public).
        metrics_path: Prometheus route, or None.
        metrics_prefix: prefix of the service's own metric names, or None.
        auth_header: header carrying the key.
        auth_scheme: prefix of the header value (``"Bearer"``), empty for the bare key.
        stream_options: ``stream_options`` keys the service accepts.
        role_chunk: the chat stream opens with a chunk that carries the role and no output
            (``"role"``: role only; ``"role+empty"``: role and ``content: ""``; ``"none"``: the role
            rides on every content delta instead).
        error_shape: one of :data:`ERROR_SHAPES` for HTTP error bodies.
        stream_error_shape: shape of an error event inside a stream.
        unauthorized: what a missing or wrong key gets: ``(status, body)`` (body None: empty),
            or None when the service itself checks no key (a gateway in front may).
        managed: a hosted service: no health or metrics route, faults only on our side.
        default_base_url: the public base URL of a managed service, or None.
        model_note: what ``model`` must be for this service.
        status_kinds: provider-specific status codes -> error kind (:func:`error_kind`).
        sources: where the facts come from.
    """

    name: str
    title: str
    chat_path: str
    completions_path: str | None
    models_path: str | None
    health_paths: tuple[str, ...]
    metrics_path: str | None
    metrics_prefix: str | None
    auth_header: str
    auth_scheme: str
    stream_options: tuple[str, ...]
    role_chunk: str
    error_shape: str
    stream_error_shape: str
    unauthorized: tuple[int, dict[str, Any] | None] | None
    managed: bool
    default_base_url: str | None
    model_note: str
    status_kinds: tuple[tuple[int, str], ...] = ()
    sources: tuple[str, ...] = ()

    @property
    def accepts_include_usage(self) -> bool:
        """Whether ``stream_options: {"include_usage": true}`` is accepted."""
        return "include_usage" in self.stream_options


_OPENAI_401 = {
    "error": {
        "message": "Incorrect API key provided.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}

#: The conventions of the OpenAI API itself, which a profile keeps unless it says otherwise: its
#: routes under ``/v1`` and the key as ``Authorization: Bearer``.
_OPENAI_CONVENTIONS: dict[str, Any] = {
    "chat_path": "/v1/chat/completions",
    "completions_path": "/v1/completions",
    "models_path": "/v1/models",
    "auth_header": "Authorization",
    "auth_scheme": "Bearer",
}


def _openai_compatible(**fields: Any) -> Profile:
    """A :class:`Profile` of ``fields`` over :data:`_OPENAI_CONVENTIONS`."""
    return Profile(**{**_OPENAI_CONVENTIONS, **fields})


def _self_hosted(**fields: Any) -> Profile:
    """An OpenAI-compatible server you run yourself: Prometheus text on ``/metrics``, not a
    managed service, no default base URL (the operator names the endpoint)."""
    return _openai_compatible(
        metrics_path="/metrics", managed=False, default_base_url=None, **fields
    )


#: The six profiles, by name.
PROFILES: dict[str, Profile] = {
    "vllm": _self_hosted(
        name="vllm",
        title="vLLM (OpenAI-compatible server)",
        health_paths=("/health",),
        metrics_prefix="vllm:",
        stream_options=("include_usage", "continuous_usage_stats"),
        role_chunk="role+empty",
        error_shape="openai",
        stream_error_shape="openai",
        unauthorized=(401, {"error": "Unauthorized"}),
        model_note="the served model name (--served-model-name, default the model path)",
        sources=(
            "https://docs.vllm.ai/en/v0.8.1/serving/openai_compatible_server.html",
            "vllm-project/vllm vllm/entrypoints/openai/protocol.py (ErrorInfo, ErrorResponse, "
            "StreamOptions)",
            "vllm-project/vllm vllm/entrypoints/openai/serving_chat.py (first chunk "
            'DeltaMessage(role=role, content=""))',
            "vllm-project/vllm vllm/entrypoints/openai/api_server.py (AuthenticationMiddleware: "
            '/v1 routes, 401 {"error": "Unauthorized"})',
        ),
    ),
    "sglang": _self_hosted(
        name="sglang",
        title="SGLang (OpenAI-compatible server)",
        health_paths=("/health", "/health_generate"),
        metrics_prefix="sglang:",
        stream_options=("include_usage", "continuous_usage_stats"),
        role_chunk="role+empty",
        error_shape="flat",
        stream_error_shape="openai",
        unauthorized=(401, {"error": "Unauthorized"}),
        model_note="the served model name (--served-model-name, default the model path)",
        sources=(
            "https://docs.sglang.io/basic_usage/native_api.html (/health, /health_generate)",
            "sgl-project/sglang python/sglang/srt/entrypoints/openai/serving_base.py "
            "(create_error_response, create_streaming_error_response)",
            "sgl-project/sglang python/sglang/srt/entrypoints/openai/serving_chat.py "
            "(stream_options include_usage / continuous_usage_stats)",
            "sgl-project/sglang python/sglang/srt/utils.py (add_api_key_middleware: Bearer, "
            '/health exempt, 401 {"error": "Unauthorized"})',
        ),
    ),
    "tgi": _self_hosted(
        name="tgi",
        title="Hugging Face TGI (Messages API)",
        health_paths=("/health",),
        metrics_prefix="tgi_",
        stream_options=("include_usage",),
        role_chunk="none",
        error_shape="tgi",
        stream_error_shape="tgi",
        unauthorized=(401, None),
        model_note='any string ("tgi"); the server serves one model',
        status_kinds=((422, "validation"), (424, "server"), (429, "overload")),
        sources=(
            "https://huggingface.co/docs/text-generation-inference/messages_api (from 1.4.0)",
            "huggingface/text-generation-inference router/src/server.rs (routes, --api-key "
            "Bearer check, InferError -> 424/429/422/500, ErrorResponse event in streams)",
            "huggingface/text-generation-inference router/src/lib.rs (ErrorResponse "
            "{error, error_type})",
            "huggingface/text-generation-inference router/src/chat.rs (stream_options "
            "include_usage, role on every delta)",
        ),
    ),
    "trtllm": _self_hosted(
        name="trtllm",
        title="TensorRT-LLM behind Triton's OpenAI-compatible frontend",
        health_paths=("/health/ready",),
        metrics_prefix="nv_",
        stream_options=("include_usage",),
        role_chunk="role+empty",
        error_shape="detail",
        stream_error_shape="openai",
        unauthorized=None,
        model_note="the Triton model name (e.g. the ensemble / tensorrt_llm_bls model)",
        sources=(
            "https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/"
            "client_guide/openai_readme.html (port 9000)",
            "triton-inference-server/server python/openai/openai_frontend/frontend/fastapi/"
            "routers/chat.py (HTTPException 400/500: {detail}), routers/observability.py "
            "(/health/ready, /metrics)",
            "triton-inference-server/server python/openai/openai_frontend/engine/"
            "triton_engine.py (role chunk with content '', stream_options include_usage); "
            "routers/chat.py checks no API key",
        ),
    ),
    "ark": _openai_compatible(
        name="ark",
        title="Volcano Engine Ark (managed)",
        chat_path="/chat/completions",
        completions_path=None,
        models_path=None,
        health_paths=(),
        metrics_path=None,
        metrics_prefix=None,
        stream_options=("include_usage",),
        role_chunk="none",
        error_shape="openai",
        stream_error_shape="openai",
        unauthorized=(
            401,
            {
                "error": {
                    "code": "AuthenticationError",
                    "message": "The API key or AK/SK in the request is missing or invalid.",
                    "param": "",
                    "type": "Unauthorized",
                }
            },
        ),
        managed=True,
        default_base_url="https://ark.cn-beijing.volces.com/api/v3",
        model_note="the inference endpoint id (ep-...) or a model id",
        status_kinds=((429, "rate_limit"),),
        sources=(
            "https://www.volcengine.com/docs/82379/1494384 (Chat API: POST /api/v3/chat/"
            "completions, stream_options)",
            "https://www.volcengine.com/docs/82379/1299023 (error codes: 401 Unauthorized/"
            "AuthenticationError, 404 InvalidEndpointOrModel.NotFound, 429 TooManyRequests/"
            "RateLimitExceeded.EndpointRPMExceeded)",
        ),
    ),
    "openai": _openai_compatible(
        name="openai",
        title="Generic OpenAI-compatible endpoint",
        health_paths=(),
        metrics_path=None,
        metrics_prefix=None,
        stream_options=("include_usage",),
        role_chunk="role+empty",
        error_shape="openai",
        stream_error_shape="openai",
        unauthorized=(401, _OPENAI_401),
        managed=True,
        default_base_url=None,
        model_note="the model name the endpoint serves",
        status_kinds=((429, "rate_limit"),),
        sources=(
            "https://platform.openai.com/docs/api-reference/chat (stream_options include_usage)",
            "https://platform.openai.com/docs/guides/error-codes (401, 429, 500, 503)",
        ),
    ),
}


def get_profile(name: str) -> Profile:
    """The profile called ``name`` (case-insensitive).

    Raises:
        KeyError: unknown name; the message lists the known ones.
    """
    key = str(name).strip().lower()
    if key not in PROFILES:
        raise KeyError(f"unknown profile {name!r} (known: {', '.join(PROFILES)})")
    return PROFILES[key]


def endpoint(profile: Profile, base_url: str, api: str = "chat") -> str:
    """Full URL of the chat (or text) completions route of ``base_url`` for ``profile``.

    A base URL ending in ``/v1`` is accepted for routes under ``/v1`` (``http://h:8000/v1`` and
    ``http://h:8000`` give the same URL).

    Raises:
        ValueError: ``api`` is ``completions`` and the profile has no such route.
    """
    path = profile.chat_path if api == "chat" else profile.completions_path
    if path is None:
        raise ValueError(f"profile {profile.name} has no {api} route")
    return join(profile, base_url, path)


def join(profile: Profile, base_url: str, path: str) -> str:
    """``base_url`` + ``path``; a base ending in ``/v1`` is the server root plus ``/v1``, so that
    ``/v1`` is dropped first (``http://h:8000/v1`` + ``/health`` is ``http://h:8000/health``)."""
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return base + path


def auth_headers(profile: Profile, key: str | None) -> dict[str, str]:
    """The auth header for ``key`` (empty without a key). The value is never logged."""
    if not key:
        return {}
    value = f"{profile.auth_scheme} {key}" if profile.auth_scheme else key
    return {profile.auth_header: value}


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def parse_error(body: bytes | str | dict[str, Any] | None) -> dict[str, Any]:
    """Read an error body of any known shape.

    Args:
        body: the raw body (bytes or text), or already parsed JSON.

    Returns:
        ``{"shape": one of ERROR_SHAPES | "text" | "empty", "message": str | None,
        "type": str | None, "code": str | None}``. ``text`` when the body is not a JSON object
        of a known shape (``message`` then holds its first 200 characters).
    """
    obj: Any = body
    if isinstance(body, bytes | bytearray):
        body = bytes(body).decode("utf-8", "replace")
    if isinstance(body, str):
        if not body.strip():
            return {"shape": "empty", "message": None, "type": None, "code": None}
        try:
            obj = json.loads(body)
        except ValueError:
            return {"shape": "text", "message": clip(body, 200).strip(), "type": None, "code": None}
    if body is None:
        return {"shape": "empty", "message": None, "type": None, "code": None}
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict):
            return {
                "shape": "openai",
                "message": _text(err.get("message")),
                "type": _text(err.get("type")),
                "code": _text(err.get("code")),
            }
        if isinstance(err, str) and "error_type" in obj:
            return {"shape": "tgi", "message": err, "type": _text(obj.get("error_type")),
                    "code": None}  # fmt: skip
        if obj.get("object") == "error":
            return {
                "shape": "flat",
                "message": _text(obj.get("message")),
                "type": _text(obj.get("type")),
                "code": _text(obj.get("code")),
            }
        if "detail" in obj:
            return {"shape": "detail", "message": _text(obj.get("detail")), "type": None,
                    "code": None}  # fmt: skip
        if isinstance(err, str):  # vLLM's 401 {"error": "Unauthorized"}
            return {"shape": "openai", "message": err, "type": None, "code": None}
    text = body if isinstance(body, str) else _text(obj) or ""
    return {"shape": "text", "message": clip(text, 200).strip(), "type": None, "code": None}


def error_kind(profile: Profile, status: int | None, error_class: str | None = None) -> str:
    """What kind of failure an attempt is, read with the provider's own status conventions.

    Kinds: ``auth`` (401/403), ``rate_limit`` (429 where the provider means a quota),
    ``overload`` (429 for a full queue, 503), ``validation`` (other 4xx, TGI's 422),
    ``server`` (5xx, TGI's 424 generation error), ``timeout``, ``transport`` (connect, reset),
    ``stream`` (error inside a 200 stream, empty, garbled, truncated), ``ok``.

    Args:
        profile: the target's profile (``status_kinds`` overrides the generic mapping).
        status: HTTP status of the attempt, None when none arrived.
        error_class: the attempt's error class (contracts.md section 3), None when ok.
    """
    if error_class is None:
        return "ok"
    if error_class.startswith("timeout_"):
        return "timeout"
    if error_class in ("connect", "reset"):
        return "transport"
    if error_class in ("stream_error", "empty", "garbled", "truncated"):
        return "stream"
    if status is not None:
        for code, kind in profile.status_kinds:
            if code == status:
                return kind
        if status in (401, 403):
            return "auth"
        if status in (429, 503):
            return "overload"
        if status >= 500:
            return "server"
        if status >= 400:
            return "validation"
    return "server"
