"""Simulated OpenAI-compatible inference engine for the lab, shaped like vLLM.

A single-process Starlette app served by uvicorn (uvloop + httptools) that imitates what
chaos drills observe on a real vLLM replica:

* ``POST /v1/chat/completions`` and ``POST /v1/completions`` (streaming SSE and non-streaming),
  ``GET /v1/models``, ``GET /health`` (503 while "loading weights") and ``GET /metrics``
  (prometheus_client, vLLM metric names, private registry, ``model_name`` label).
* Timing model: weight-load delay, a decaying warm-up penalty on the first requests, prefill time
  proportional to prompt tokens, and a fixed inter-token latency paced to absolute deadlines (no
  drift). Continuous batching: at most ``max_num_seqs`` sequences run; the rest wait in a bounded
  FIFO queue; when it is full the request is refused at once (429 or 503).
* Memory: each running sequence holds real, touched bytes for its KV cache
  (``kv_bytes_per_token`` per prompt + generated token, allocated in 16-token blocks like paged
  attention), freed when the sequence ends or the client disconnects, so a cgroup memory limit
  produces a real kernel OOM kill under long contexts.
* Ledger: one JSON line per generation started (ground truth for served requests / duplicates).
* Fault modes (lab-only, see "Fault modes" below): ``hang``, ``reset_after_k``, ``stall``,
  ``error_in_stream``, ``empty``, ``garbled``, ``truncated``, ``slowdown``,
  ``crash_on_long_prompt``; set at run time through ``POST /admin/faults`` or per request with the
  ``X-Chaos-Fault`` header. Every sabotaged request gets a ``"event": "fault"`` ledger line.
  Who may arm them: loopback peers, or, when the engine is started with ``--admin-token-file``
  (as the lab starts every sim replica), only a caller presenting that token.

Prompt tokens are approximated as ``max(1, ceil(len(text) / 4))`` characters-per-token over the
concatenated message contents (chat) or the prompt string (completions); a prompt given as a list
of token ids counts one token per id.

Run: ``python -m chaoslib_infer.lab.engine --port 8000 --replica-id r0`` (see ``--help``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import os
import random
import signal
import socket
import struct
import sys
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chaoslib_infer.lab import kernel_stamps

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Tokens per KV-cache block (memory is allocated block by block, like vLLM's paged attention).
KV_BLOCK_TOKENS = 16

_CHARS_PER_TOKEN = 4

# Output vocabulary: English words (1-byte UTF-8), CJK (3-byte), accented Latin (2-byte) and an
# emoji (4-byte), so clients that split characters across network reads get exercised.
_WORDS: tuple[str, ...] = (
    " the", " model", " token", " cache", " drill", " chaos", " latency", " replica", " stream",
    " batch", " queue", " memory", " kernel", " signal", " request", " server", " fleet",
    " recovery", " warm", " load", " prefill", " decode", " a", " of", " and", " to", " is",
    " café", " naïve", ",", ".",
)  # fmt: skip
_CJK: tuple[str, ...] = (
    "中", "文", "模", "型", "推", "理", "缓", "存", "延", "迟", "你好", "世界", "服务", "请求",
)  # fmt: skip
_EMOJI: tuple[str, ...] = ("🙂", "🚀")


@dataclass
class EngineConfig:
    """Configuration of one simulated engine replica (mirrors the CLI flags).

    Times are seconds, sizes bytes / tokens.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    replica_id: str = "r0"
    ledger: Path | None = None
    model: str = "chaos-sim"
    load_delay_s: float = 1.0
    warmup_requests: int = 3
    warmup_penalty_s: float = 0.5
    prefill_s_per_token: float = 0.0002
    itl_s: float = 0.02
    max_num_seqs: int = 16
    max_waiting: int = 64
    queue_full_status: int = 429
    kv_bytes_per_token: int = 16384
    kv_cache_tokens: int = 65536
    zero_latency: bool = False
    output_tokens: int = 32
    graceful_shutdown_s: float = 5.0
    admin_faults: bool = True
    #: lab admin token: when set, ``/admin/faults`` and the ``X-Chaos-Fault`` header need it (header
    #: ``X-Chaos-Admin-Token``) from every peer, loopback included; None: loopback peers only
    admin_token: str | None = field(default=None, repr=False)
    #: provider profile mimicked (``chaoslib_infer.lab.mimic``); None: the plain engine
    profile: str | None = None
    ttft_log: Path | None = None

    def __post_init__(self) -> None:
        """Validate values.

        Raises:
            ValueError: on a value the engine cannot run with.
        """
        if self.queue_full_status not in (429, 503):
            raise ValueError("queue_full_status must be 429 or 503")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_waiting < 0 or self.warmup_requests < 0 or self.output_tokens < 1:
            raise ValueError("max_waiting/warmup_requests must be >= 0, output_tokens >= 1")
        if self.kv_bytes_per_token < 0 or self.kv_cache_tokens < 1:
            raise ValueError("kv_bytes_per_token must be >= 0 and kv_cache_tokens >= 1")
        if min(self.load_delay_s, self.warmup_penalty_s, self.prefill_s_per_token, self.itl_s) < 0:
            raise ValueError("delays must be >= 0")
        from chaoslib_infer.providers import PROFILES

        if self.profile is not None and self.profile not in PROFILES:
            raise ValueError(f"profile must be one of {', '.join(PROFILES)}")


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


def _error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status)


def count_text_tokens(text: str) -> int:
    """Approximate a text's token count as ``ceil(len(text) / 4)`` (at least 1).

    Args:
        text: the text.

    Returns:
        Approximate number of tokens (>= 1).
    """
    return max(1, math.ceil(len(text) / _CHARS_PER_TOKEN))


def generate_tokens(request_id: str, n: int) -> list[str]:
    """Deterministic output tokens for a request, one token per stream chunk.

    Every token at index ``k % 4 == 1`` is CJK, so any output of two or more tokens contains a
    CJK character; others mix English words, accented Latin and emoji. No token is empty, and
    tokens are whole characters (never a split code point).

    Args:
        request_id: seeds the generator (same id, same text).
        n: number of tokens.

    Returns:
        ``n`` non-empty strings.
    """
    seed = int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "big")
    rng = random.Random(seed)
    out: list[str] = []
    for k in range(n):
        if k % 4 == 1:
            out.append(rng.choice(_CJK))
        elif rng.random() < 0.03:
            out.append(rng.choice(_EMOJI))
        else:
            out.append(rng.choice(_WORDS))
    return out


# --------------------------------------------------------------------------------------------
# Fault modes (lab-only)
# --------------------------------------------------------------------------------------------
# Lab-only control plane. ``/admin/faults`` answers only when fault injection is enabled (the
# default; ``--no-admin-faults`` turns it and the ``X-Chaos-Fault`` header off), and then:
#
# * started with ``--admin-token-file FILE`` (the lab does this for every sim replica: a per-lab
#   random token in its 0700 state directory, ``Lab.admin_token()``): only to a request carrying
#   ``X-Chaos-Admin-Token: <token>``, from any peer (replicas on lab nodes listen on a namespace
#   address, where the caller is not loopback); the ``X-Chaos-Fault`` header needs it too;
# * without a token: only to peers on a loopback address.
#
# Anything else gets 403. Never expose a replica port beyond the lab.

#: Fault modes, in the order they are documented.
FAULT_MODES: tuple[str, ...] = (
    "hang",
    "reset_after_k",
    "stall",
    "error_in_stream",
    "empty",
    "garbled",
    "truncated",
    "slowdown",
    "crash_on_long_prompt",
)
#: Request header carrying the lab's admin token (see ``EngineConfig.admin_token``).
ADMIN_TOKEN_HEADER = "x-chaos-admin-token"
#: Request header sabotaging one request: ``X-Chaos-Fault: mode;k=3;t=2`` (see ``parse_fault_header``).
FAULT_HEADER = "x-chaos-fault"
#: Exit status of a replica that ``crash_on_long_prompt`` (``how=exit``) killed.
CRASH_EXIT_CODE = 70

#: Per mode: accepted parameters and their defaults (k: tokens sent first; t: stall seconds;
#: n: prompt-token threshold; factor: ITL growth per request served; how: variant).
FAULT_PARAMS: dict[str, dict[str, Any]] = {
    "hang": {},
    "reset_after_k": {"k": 3},
    "stall": {"k": 3, "t": 2.0},
    "error_in_stream": {"k": 1},
    "empty": {},
    "garbled": {"k": 1, "how": "both"},
    "truncated": {"k": 3},
    "slowdown": {"factor": 0.05},
    "crash_on_long_prompt": {"n": 1024, "how": "exit"},
}
_FAULT_HOW: dict[str, tuple[str, ...]] = {
    "garbled": ("fffd", "bytes", "both"),
    "crash_on_long_prompt": ("exit", "kill"),
}
_FAULT_KEYS = frozenset({"mode", "probability", "ttl_s", "params", "seed"})


@dataclass
class FaultSpec:
    """One fault mode armed on the engine (admin endpoint) or carried by one request (header).

    Attributes:
        mode: one of :data:`FAULT_MODES`.
        params: the mode's parameters (:data:`FAULT_PARAMS`, defaults filled in).
        probability: chance (0..1) that a request it applies to is sabotaged.
        ttl_s: seconds after ``set_at`` when an admin fault expires by itself (None: never).
        source: ``"admin"`` or ``"header"``.
        set_at: unix seconds when it was set.
        served_at_set: generations the engine had started when it was set (``slowdown`` counts
            requests served from there; a header fault counts from the engine's start).
        fault_id: short random id.
    """

    mode: str
    params: dict[str, Any]
    probability: float = 1.0
    ttl_s: float | None = None
    source: str = "admin"
    set_at: float = field(default_factory=time.time)
    served_at_set: int = 0
    fault_id: str = field(default_factory=lambda: os.urandom(4).hex())
    _expires: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        """Arm the expiry clock (monotonic)."""
        if self.ttl_s is not None:
            self._expires = time.monotonic() + self.ttl_s

    def expired(self) -> bool:
        """True once ``ttl_s`` has passed."""
        return self._expires is not None and time.monotonic() >= self._expires

    def remaining_s(self) -> float | None:
        """Seconds until it expires (None: no ``ttl_s``)."""
        return None if self._expires is None else max(0.0, self._expires - time.monotonic())

    def applies(self, prompt_tokens: int) -> bool:
        """Whether this fault concerns a request with ``prompt_tokens`` prompt tokens."""
        if self.mode == "crash_on_long_prompt":
            return prompt_tokens > int(self.params["n"])
        return True

    def to_json(self) -> dict[str, Any]:
        """JSON-able description (what ``GET /admin/faults`` lists)."""
        out: dict[str, Any] = {
            "id": self.fault_id,
            "mode": self.mode,
            **self.params,
            "probability": self.probability,
            "ttl_s": self.ttl_s,
            "source": self.source,
            "set_at": self.set_at,
        }
        remaining = self.remaining_s()
        if remaining is not None:
            out["expires_in_s"] = round(remaining, 3)
        return out


def _fault_value(mode: str, key: str, value: Any, text: bool) -> Any:
    """Validate one parameter (``text``: it came from the header as a string).

    Raises:
        RequestError: 400 on a bad value.
    """
    bad = RequestError(400, f"fault {mode}: bad value for {key!r}: {value!r}")
    if key in ("k", "n"):
        if text:
            try:
                value = int(str(value), 10)
            except ValueError:
                raise bad from None
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise bad
        return value
    if key in ("t", "factor", "probability", "ttl_s"):
        if text:
            try:
                value = float(str(value))
            except ValueError:
                raise bad from None
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise bad
        value = float(value)
        if not math.isfinite(value) or value < 0:
            raise bad
        if key == "probability" and value > 1:
            raise bad
        if key == "ttl_s" and value == 0:
            raise bad
        return value
    if key == "how":
        choices = _FAULT_HOW.get(mode, ())
        if not isinstance(value, str) or value.lower() not in choices:
            raise RequestError(400, f"fault {mode}: how must be one of {', '.join(choices)}")
        return value.lower()
    raise bad  # pragma: no cover - keys are checked by the caller


def parse_fault(fields: Mapping[str, Any], source: str = "admin", text: bool = False) -> FaultSpec:
    """Validate a fault description into a :class:`FaultSpec`.

    Args:
        fields: ``{"mode": ..., <mode params>..., "probability": 0..1, "ttl_s": s | None}``; the
            mode's parameters may also be nested under ``"params"``. Mode names are
            case-insensitive and ``-`` stands for ``_``.
        source: ``"admin"`` or ``"header"`` (a header cannot carry ``ttl_s``).
        text: values are strings to convert (the header form).

    Returns:
        The fault, parameters defaulted from :data:`FAULT_PARAMS`.

    Raises:
        RequestError: 400 on an unknown mode, an unknown parameter or a bad value.
    """
    if not isinstance(fields, Mapping):
        raise RequestError(400, "a fault must be a JSON object with a 'mode'")
    raw_mode = fields.get("mode")
    if not isinstance(raw_mode, str) or not raw_mode.strip():
        raise RequestError(400, f"a fault needs a 'mode', one of {', '.join(FAULT_MODES)}")
    mode = raw_mode.strip().lower().replace("-", "_")
    if mode not in FAULT_PARAMS:
        raise RequestError(400, f"unknown fault mode {raw_mode!r}; known: {', '.join(FAULT_MODES)}")
    merged: dict[str, Any] = {k: v for k, v in fields.items() if k != "params"}
    nested = fields.get("params")
    if nested is not None:
        if not isinstance(nested, Mapping):
            raise RequestError(400, "'params' must be an object")
        for k, v in nested.items():
            if k in merged:
                raise RequestError(400, f"fault {mode}: parameter {k!r} given twice")
            merged[k] = v
    allowed = FAULT_PARAMS[mode]
    params = dict(allowed)
    probability, ttl_s = 1.0, None
    for key, value in merged.items():
        if key == "mode" or (key == "seed" and source == "admin"):
            continue
        if key == "probability":
            probability = _fault_value(mode, key, value, text)
        elif key == "ttl_s" and source == "admin":
            ttl_s = None if value is None else _fault_value(mode, key, value, text)
        elif key in allowed:
            params[key] = _fault_value(mode, key, value, text)
        else:
            known = ", ".join(sorted(set(allowed) | {"probability"}))
            raise RequestError(400, f"fault {mode}: unknown parameter {key!r} (accepted: {known})")
    return FaultSpec(mode=mode, params=params, probability=probability, ttl_s=ttl_s, source=source)


def parse_fault_header(value: str) -> FaultSpec:
    """Parse an ``X-Chaos-Fault`` header value.

    Syntax: ``mode[;key=value]...``, e.g. ``stall;k=3;t=2`` or ``garbled; how=bytes``. Blanks
    around parts are ignored, as are empty parts (``hang;``); keys and the mode are
    case-insensitive; ``p`` is short for ``probability``; ``mode=stall`` is accepted as the first
    part. Parameters are those of :data:`FAULT_PARAMS` plus ``probability`` (no ``ttl_s``).

    Returns:
        The fault (``source="header"``).

    Raises:
        RequestError: 400 on an empty header, an unknown mode or parameter, a part without
            ``=``, a parameter given twice, or a bad value.
    """
    parts = [p.strip() for p in value.split(";")]
    parts = [p for p in parts if p]
    if not parts:
        raise RequestError(400, "empty X-Chaos-Fault header")
    head = parts[0]
    if head.lower().startswith("mode="):
        head = head[5:].strip()
    fields: dict[str, Any] = {"mode": head}
    for part in parts[1:]:
        key, sep, val = part.partition("=")
        key = key.strip().lower().replace("-", "_")
        val = val.strip().strip("\"'")
        if not sep or not key or not val:
            raise RequestError(400, f"X-Chaos-Fault: malformed parameter {part!r} (want key=value)")
        if key == "p":
            key = "probability"
        if key in fields:
            raise RequestError(400, f"X-Chaos-Fault: parameter {key!r} given twice")
        fields[key] = val
    return parse_fault(fields, source="header", text=True)


class _FaultBoard:
    """The faults armed on one engine through the admin endpoint (one per mode)."""

    def __init__(self) -> None:
        self._faults: dict[str, FaultSpec] = {}
        self.rng = random.Random()

    def set(self, spec: FaultSpec) -> None:
        """Arm ``spec``, replacing a fault of the same mode."""
        self._faults.pop(spec.mode, None)
        self._faults[spec.mode] = spec

    def clear(self, mode: str | None = None) -> list[FaultSpec]:
        """Disarm one mode (or every mode); returns what was armed."""
        if mode is None:
            out = list(self._faults.values())
            self._faults.clear()
            return out
        spec = self._faults.pop(mode, None)
        return [spec] if spec is not None else []

    def active(self) -> list[FaultSpec]:
        """Armed faults, expired ones dropped."""
        for mode in [m for m, f in self._faults.items() if f.expired()]:
            del self._faults[mode]
        return list(self._faults.values())

    def roll(self, spec: FaultSpec) -> bool:
        """True when a request is sabotaged by ``spec`` (its probability)."""
        return spec.probability >= 1.0 or self.rng.random() < spec.probability

    def pick(self, prompt_tokens: int) -> FaultSpec | None:
        """The first armed fault that applies to the request and wins its probability roll."""
        for spec in self.active():
            if spec.applies(prompt_tokens) and self.roll(spec):
                return spec
        return None


def admin_allowed(config: EngineConfig, client: Any, token: str | None) -> str | None:
    """Whether a caller may use the fault control plane (``/admin/faults``, ``X-Chaos-Fault``).

    Args:
        config: the engine's configuration (``admin_token``).
        client: the ASGI ``client`` tuple ``(host, port)`` of the peer (may be None).
        token: the request's ``X-Chaos-Admin-Token`` header value, or None.

    Returns:
        None when allowed, else the reason for the 403 (one line, never the token).
    """
    if config.admin_token is not None:
        given = (token or "").encode()
        if hmac.compare_digest(given, config.admin_token.encode()):
            return None
        what = "a wrong" if token else "no"
        return f"fault injection needs the lab's admin token ({what} X-Chaos-Admin-Token given)"
    if _is_loopback(client):
        return None
    return (
        "/admin/faults answers loopback clients only (or start the engine with --admin-token-file)"
    )


def _is_loopback(client: Any) -> bool:
    """True when an ASGI ``client`` tuple is a loopback address."""
    if not client:
        return False
    try:
        return ipaddress.ip_address(str(client[0])).is_loopback
    except ValueError:
        return False


def _arm_reset(scope: Scope) -> bool:
    """Make the close of this request's TCP connection an abort (RST), via ``SO_LINGER`` 0.

    Finds the connection's socket among the process's file descriptors by its local port and peer
    address (ASGI does not expose the transport). Returns False when there is no such socket (an
    in-process ASGI transport): the close is then a plain one, still without a complete reply.
    """
    client, server = scope.get("client"), scope.get("server")
    if not client or not server:
        return False
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return False
    for name in names:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        with sock:
            try:
                if sock.type != socket.SOCK_STREAM:
                    continue
                peer, local = sock.getpeername(), sock.getsockname()
            except OSError:
                continue
            if (
                isinstance(peer, tuple)
                and tuple(peer[:2]) == (client[0], client[1])
                and local[1] == server[1]
            ):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return True
    return False


class _AbortLogFilter(logging.Filter):
    """Drops uvicorn's "returned without completing response" error for injected resets only."""

    pending = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """Return False for the log line of an injected reset."""
        if _AbortLogFilter.pending > 0 and "without completing response" in record.getMessage():
            _AbortLogFilter.pending -= 1
            return False
        return True


_ABORT_LOG_FILTER = _AbortLogFilter()


class _HangResponse:
    """ASGI response of the ``hang`` fault: sends nothing until the client leaves, or until the
    hang is cleared (``DELETE /admin/faults``) or its ``ttl_s`` runs out: then a 503, so no hung
    connection outlives the fault (a load balancer keeps its side open after the client left)."""

    def __init__(self, hung: set[asyncio.Future[None]], spec: FaultSpec) -> None:
        self.hung = hung
        self.spec = spec

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        released: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.hung.add(released)

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        watcher = asyncio.ensure_future(watch())
        timeout = self.spec.remaining_s()
        try:
            await asyncio.wait({watcher, released}, timeout=timeout, return_when="FIRST_COMPLETED")
            if not watcher.done():
                body = error_body(503, "engine fault hang cleared: request dropped")
                await JSONResponse(body, status_code=503)(scope, receive, send)
        finally:
            watcher.cancel()
            self.hung.discard(released)
            if not released.done():
                released.cancel()


class _Metrics:
    """vLLM-named Prometheus metrics in a private registry."""

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.",
            labels, registry=r,
        )  # fmt: skip
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
            labels, registry=r,
        )  # fmt: skip
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
            labels, registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            labels, registry=r,
            buckets=[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                     2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0],
        )  # fmt: skip
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            labels, registry=r,
            buckets=[0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
                     0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0],
        )  # fmt: skip
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
            labels, registry=r,
            buckets=[0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                     60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0],
        )  # fmt: skip
        # prometheus_client appends "_total" to counter names on exposition.
        self.success = Counter(
            "vllm:request_success", "Count of successfully processed requests.",
            ["model_name", "finished_reason"], registry=r,
        )  # fmt: skip
        self.preemptions = Counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.",
            labels, registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=r
        )
        self.model = model
        self.preemptions.labels(model).inc(0)
        self.prompt_tokens.labels(model).inc(0)
        self.generation_tokens.labels(model).inc(0)
        for reason in ("stop", "length", "abort"):
            self.success.labels(model, reason).inc(0)


@dataclass
class _Ticket:
    """A request's place in the scheduler: granted a running slot, or waiting on ``fut``."""

    fut: asyncio.Future[None] | None = None
    granted: bool = False


class _Scheduler:
    """Continuous-batching admission: ``max_running`` slots plus a bounded FIFO wait queue."""

    def __init__(self, max_running: int, max_waiting: int) -> None:
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.running = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    def try_admit(self) -> _Ticket | None:
        """Take a slot or a queue place at once; ``None`` when the queue is full."""
        if self.running < self.max_running and not self.waiters:
            self.running += 1
            return _Ticket(granted=True)
        if len(self.waiters) >= self.max_waiting:
            return None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        return _Ticket(fut=fut)

    async def wait(self, ticket: _Ticket) -> None:
        """Wait until ``ticket`` holds a running slot (cancellable)."""
        if ticket.granted or ticket.fut is None:
            return
        try:
            await ticket.fut
        except asyncio.CancelledError:
            if ticket.fut.done() and not ticket.fut.cancelled():
                ticket.granted = True  # granted just before the cancel: caller releases it
            raise
        ticket.granted = True

    def release(self, ticket: _Ticket) -> None:
        """Give back the ticket's slot (or queue place) and start the next waiter."""
        fut = ticket.fut
        if not ticket.granted and fut is not None:
            if fut.done() and not fut.cancelled():
                ticket.granted = True  # a slot was handed to us but never picked up
            else:  # still queued (its future may be cancelled already)
                with contextlib.suppress(ValueError):
                    self.waiters.remove(fut)
                fut.cancel()
        if ticket.granted:
            ticket.granted = False
            self.running -= 1
        ticket.fut = None
        while self.waiters and self.running < self.max_running:
            fut = self.waiters.popleft()
            if fut.done():
                continue
            self.running += 1
            fut.set_result(None)


class _KvHold:
    """Real, touched bytes standing for one sequence's KV cache, grown block by block."""

    def __init__(self, engine: _Engine) -> None:
        self._engine = engine
        self._block_bytes = engine.config.kv_bytes_per_token * KV_BLOCK_TOKENS
        self._blocks: list[bytes] = []
        self._capacity = 0  # tokens the allocated blocks can hold
        self.tokens = 0

    def grow(self, tokens: int) -> None:
        """Hold ``tokens`` more tokens; allocates (and writes) whole blocks as needed."""
        self.tokens += tokens
        self._engine.kv_tokens += tokens
        if self._block_bytes == 0 or self.tokens <= self._capacity:
            return
        blocks = -(-(self.tokens - self._capacity) // KV_BLOCK_TOKENS)
        self._blocks.append(b"\x01" * (self._block_bytes * blocks))  # bytes * n writes every page
        self._capacity += blocks * KV_BLOCK_TOKENS

    def release(self) -> None:
        """Free every held byte."""
        self._engine.kv_tokens -= self.tokens
        self.tokens = 0
        self._capacity = 0
        self._blocks.clear()


@dataclass
class _Job:
    """One parsed completion request."""

    request_id: str
    chat: bool
    stream: bool
    include_usage: bool
    prompt_tokens: int
    max_tokens: int
    finish_reason: str
    arrival: float  # perf_counter seconds
    created: int = field(default_factory=lambda: int(time.time()))


class _Engine:
    """Shared state of one replica: config, scheduler, KV accounting, metrics, ledger."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.t_start = time.monotonic()
        self.scheduler = _Scheduler(config.max_num_seqs, config.max_waiting)
        self.kv_tokens = 0
        self.generations_started = 0
        self.faults = _FaultBoard()
        self.hung: set[asyncio.Future[None]] = set()
        self.metrics = _Metrics(config.model)
        m = config.model
        self.metrics.running.labels(m).set_function(lambda: self.scheduler.running)
        self.metrics.waiting.labels(m).set_function(lambda: len(self.scheduler.waiters))
        self.metrics.kv_usage.labels(m).set_function(
            lambda: self.kv_tokens / self.config.kv_cache_tokens
        )
        self._ledger_fd: int | None = None
        if config.ledger is not None:
            config.ledger.parent.mkdir(parents=True, exist_ok=True)
            self._ledger_fd = os.open(config.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._ttft_fd: int | None = None
        if config.ttft_log is not None:
            self._ttft_fd = os.open(config.ttft_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def ready(self) -> bool:
        """True once the simulated weight load is over."""
        return time.monotonic() - self.t_start >= self.config.load_delay_s

    def record_generation(self, request_id: str) -> float:
        """Append the ledger line for a generation that starts now; returns the warm-up penalty (s)."""
        if self._ledger_fd is not None:
            line = json.dumps(
                {
                    "t": time.time(),
                    "event": "generation",
                    "replica": self.config.replica_id,
                    "request_id": request_id,
                    "pid": os.getpid(),
                }
            )
            os.write(self._ledger_fd, (line + "\n").encode())
        i = self.generations_started
        self.generations_started += 1
        n = self.config.warmup_requests
        if self.config.zero_latency or i >= n:
            return 0.0
        return self.config.warmup_penalty_s * (n - i) / n  # linear decay: full, ..., 1/n

    def _ledger_line(self, entry: dict[str, Any]) -> None:
        if self._ledger_fd is not None:
            os.write(self._ledger_fd, (json.dumps(entry) + "\n").encode())

    def record_fault(self, spec: FaultSpec, request_id: str) -> None:
        """Append the ledger line of a request sabotaged by ``spec`` (ground truth).

        Line: ``{"t", "event": "fault", "mode", "replica", "request_id", "pid", "source",
        "params"}``.
        """
        self._ledger_line(
            {
                "t": time.time(),
                "event": "fault",
                "mode": spec.mode,
                "replica": self.config.replica_id,
                "request_id": request_id,
                "pid": os.getpid(),
                "source": spec.source,
                "params": spec.params,
            }
        )

    def record_admin(self, action: str, specs: list[FaultSpec]) -> None:
        """Ledger line ``{"t", "event": "fault_set"|"fault_clear", "replica", "modes", "pid"}``."""
        self._ledger_line(
            {
                "t": time.time(),
                "event": f"fault_{action}",
                "replica": self.config.replica_id,
                "modes": [f.mode for f in specs],
                "faults": [f.to_json() for f in specs],
                "pid": os.getpid(),
            }
        )

    def choose_fault(self, header: str | None, prompt_tokens: int) -> FaultSpec | None:
        """The fault sabotaging a request: its ``X-Chaos-Fault`` header, else an armed fault.

        Raises:
            RequestError: 400 on a malformed header.
        """
        if header is not None:
            spec = parse_fault_header(header)
            ok = spec.applies(prompt_tokens) and self.faults.roll(spec)
            return spec if ok else None
        return self.faults.pick(prompt_tokens)

    def release_hung(self) -> int:
        """End every request held by a ``hang`` fault (they get a 503); returns how many."""
        n = 0
        for fut in list(self.hung):
            if not fut.done():
                fut.set_result(None)
                n += 1
        return n

    def itl_scale(self, spec: FaultSpec | None) -> float:
        """ITL multiplier: ``1 + factor * requests served since the slowdown was set``."""
        if spec is None or spec.mode != "slowdown":
            return 1.0
        served = max(0, self.generations_started - spec.served_at_set)
        return 1.0 + float(spec.params["factor"]) * served

    def crash(self, spec: FaultSpec, prompt_tokens: int) -> None:
        """Kill this process (``crash_on_long_prompt``): ``os._exit`` or SIGKILL to itself."""
        how = spec.params.get("how", "exit")
        print(
            f"lab-engine fault crash_on_long_prompt: prompt_tokens={prompt_tokens} > "
            f"n={spec.params['n']}; replica={self.config.replica_id} pid={os.getpid()} dies ({how})",
            file=sys.stderr,
            flush=True,
        )
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(CRASH_EXIT_CODE)

    def record_ttft(
        self, request_id: str, ttft_s: float, stamps: kernel_stamps.Stamps | None = None
    ) -> None:
        """With ``--ttft-log``: append ``{"request_id", "ttft_s", "t"}`` for a first token just
        sent (``ttft_s``: seconds from arrival to the first token handed to the transport, the
        value the TTFT histogram observes; ``t``: unix seconds, now), plus, with ``stamps``
        (``lab.kernel_stamps``), ``rx_at`` (the request's last byte arrived on the socket),
        ``tx_at`` (the first token's bytes left it), unix seconds, ``ttft_kernel_s`` =
        ``tx_at - rx_at`` and their sources ``rx_source``, ``tx_source``."""
        if self._ttft_fd is not None:
            row: dict[str, Any] = {"request_id": request_id, "ttft_s": ttft_s, "t": time.time()}
            if stamps is not None and stamps.rx_at is not None and stamps.tx_at is not None:
                row.update(
                    rx_at=stamps.rx_at,
                    tx_at=stamps.tx_at,
                    ttft_kernel_s=stamps.tx_at - stamps.rx_at,
                    rx_source=stamps.rx_source,
                    tx_source=stamps.tx_source,
                )
            os.write(self._ttft_fd, (json.dumps(row) + "\n").encode())

    def close(self) -> None:
        """Close the ledger (and TTFT log) files."""
        if self._ledger_fd is not None:
            os.close(self._ledger_fd)
            self._ledger_fd = None
        if self._ttft_fd is not None:
            os.close(self._ttft_fd)
            self._ttft_fd = None


def _chunk_templates(job: _Job, model: str) -> tuple[str, str, str]:
    """(prefix, suffix, id) so a content chunk is ``prefix + json.dumps(token) + suffix``."""
    if job.chat:
        cid = f"chatcmpl-{job.request_id}"
        head = (
            f'{{"id":{json.dumps(cid)},"object":"chat.completion.chunk","created":{job.created},'
            f'"model":{json.dumps(model)},"choices":[{{"index":0,'
        )
        return head + '"delta":{"content":', '},"logprobs":null,"finish_reason":null}]}', cid
    cid = f"cmpl-{job.request_id}"
    head = (
        f'{{"id":{json.dumps(cid)},"object":"text_completion","created":{job.created},'
        f'"model":{json.dumps(model)},"choices":[{{"index":0,'
    )
    return head + '"text":', ',"logprobs":null,"finish_reason":null,"stop_reason":null}]}', cid


def _usage(job: _Job, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": job.prompt_tokens + completion_tokens,
    }


class _GenerationResponse:
    """ASGI response that queues, generates and streams (or returns) one completion.

    A watcher task listens for ``http.disconnect``; on disconnect the generation is cancelled and
    the KV bytes and the scheduler slot are freed. ``fault`` (optional) sabotages the reply: see
    "Fault modes".
    """

    def __init__(
        self, engine: _Engine, job: _Job, ticket: _Ticket, fault: FaultSpec | None = None
    ) -> None:
        self.engine = engine
        self.job = job
        self.ticket = ticket
        self.fault = fault
        self.mode = fault.mode if fault is not None else None
        self.itl_scale = engine.itl_scale(fault)
        self.disconnected = False
        self.stamps: kernel_stamps.Stamps | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.stamps = kernel_stamps.stamps_of(scope)

        async def watch() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    self.disconnected = True
                    task.cancel()
                    return

        watcher = asyncio.create_task(watch())
        try:
            if self.job.stream:
                await self._stream(send)
            else:
                await self._whole(send)
            if self.mode == "reset_after_k":
                _arm_reset(scope)  # returning without completing: uvicorn closes -> RST
                _AbortLogFilter.pending += 1
        except asyncio.CancelledError:
            if not self.disconnected:
                raise
            task.uncancel()
        finally:
            watcher.cancel()
            self.engine.scheduler.release(self.ticket)

    def _limit(self) -> int | None:
        """Tokens to generate when the fault cuts the reply short (None: all of them)."""
        if self.mode in ("reset_after_k", "truncated", "error_in_stream"):
            assert self.fault is not None
            return int(self.fault.params["k"])
        return 0 if self.mode == "empty" else None

    async def _generate(self, emit: Callable[[str], Awaitable[None]] | None) -> list[str]:
        """Wait for a slot, then produce the tokens on their deadlines; returns the tokens.

        Faults: ``stall`` shifts every deadline from token ``k`` on by ``t`` seconds; ``slowdown``
        scales the inter-token latency; a fault that cuts the reply stops after ``_limit()`` tokens.
        """
        eng, job, cfg = self.engine, self.job, self.engine.config
        limit = self._limit()
        n_tokens = job.max_tokens if limit is None else min(limit, job.max_tokens)
        itl = cfg.itl_s * self.itl_scale
        stall_at, stall_s = -1, 0.0
        if self.mode == "stall":
            assert self.fault is not None
            stall_at, stall_s = int(self.fault.params["k"]), float(self.fault.params["t"])
        await eng.scheduler.wait(self.ticket)
        loop = asyncio.get_running_loop()
        penalty = eng.record_generation(job.request_id)
        m = eng.metrics
        m.prompt_tokens.labels(cfg.model).inc(job.prompt_tokens)
        kv = _KvHold(eng)
        produced: list[str] = []
        try:
            kv.grow(job.prompt_tokens)
            t0 = loop.time()
            first = t0 + penalty + job.prompt_tokens * cfg.prefill_s_per_token
            last_t = 0.0
            for k, tok in enumerate(generate_tokens(job.request_id, n_tokens)):
                if k == stall_at:
                    first += stall_s  # this and every later deadline move by the stall
                    if cfg.zero_latency:
                        await asyncio.sleep(stall_s)
                if cfg.zero_latency:
                    await asyncio.sleep(0)
                else:
                    delay = first + k * itl - loop.time()
                    await asyncio.sleep(delay if delay > 0 else 0)
                kv.grow(1)
                produced.append(tok)
                if emit is not None:
                    await emit(tok)
                now = time.perf_counter()
                if k == 0:
                    m.ttft.labels(cfg.model).observe(now - job.arrival)
                    eng.record_ttft(job.request_id, now - job.arrival, self.stamps)
                else:
                    m.itl.labels(cfg.model).observe(now - last_t)
                last_t = now
            m.e2e.labels(cfg.model).observe(time.perf_counter() - job.arrival)
            if limit is None:
                reason = job.finish_reason
            else:
                reason = "stop" if self.mode == "empty" else "abort"
            m.success.labels(cfg.model, reason).inc()
        except asyncio.CancelledError:
            if self.disconnected:
                m.success.labels(cfg.model, "abort").inc()
            raise
        finally:
            m.generation_tokens.labels(cfg.model).inc(len(produced))
            kv.release()
        return produced

    def _garble_how(self, index: int) -> str | None:
        """How output token ``index`` is garbled (``"fffd"``/``"bytes"``), or None."""
        if self.mode != "garbled":
            return None
        assert self.fault is not None
        k, how = int(self.fault.params["k"]), str(self.fault.params["how"])
        if how == "both":
            return "fffd" if index == k else ("bytes" if index == k + 1 else None)
        return how if index == k else None

    def _fault_error(self) -> dict[str, Any]:
        assert self.fault is not None
        return error_body(500, f"engine fault injected ({self.fault.mode}): generation failed")

    async def _stream(self, send: Send) -> None:
        job, model = self.job, self.engine.config.model
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                ],
            }
        )
        prefix, suffix, cid = _chunk_templates(job, model)
        obj = "chat.completion.chunk" if job.chat else "text_completion"
        base = {"id": cid, "object": obj, "created": job.created, "model": model}
        if job.chat:
            role = {
                **base,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant"},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
            await send(_sse(role))
        emitted = 0

        async def emit(tok: str) -> None:
            nonlocal emitted
            how = self._garble_how(emitted)
            emitted += 1
            if how is None:
                content = json.dumps(tok, ensure_ascii=False).encode()
            elif how == "fffd":  # a literal U+FFFD: the server itself produced a broken character
                content = json.dumps(tok + "\ufffd", ensure_ascii=False).encode()
            else:  # raw bytes that are not UTF-8 at all inside the JSON string
                content = json.dumps(tok, ensure_ascii=False).encode()[:-1] + b'\xff\xfe"'
            body = b"data: " + prefix.encode() + content + suffix.encode() + b"\n\n"
            await send({"type": "http.response.body", "body": body, "more_body": True})

        tokens = await self._generate(emit)
        if self.mode == "reset_after_k":
            return  # the caller aborts the connection
        if self.mode == "truncated":  # clean end of the HTTP body: no finish_reason, no [DONE]
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        if self.mode == "error_in_stream":
            out = _sse(self._fault_error())["body"] + b"data: [DONE]\n\n"
            await send({"type": "http.response.body", "body": out, "more_body": False})
            return
        finish = "stop" if self.mode == "empty" else job.finish_reason
        if job.chat:
            final_choice: dict[str, Any] = {
                "index": 0,
                "delta": {},
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        else:
            final_choice = {
                "index": 0,
                "text": "",
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        out = _sse({**base, "choices": [final_choice]})["body"]
        if job.include_usage:
            out += _sse({**base, "choices": [], "usage": _usage(job, len(tokens))})["body"]
        out += b"data: [DONE]\n\n"
        await send({"type": "http.response.body", "body": out, "more_body": False})

    async def _whole(self, send: Send) -> None:
        job, model = self.job, self.engine.config.model
        tokens = await self._generate(None)
        garble = [self._garble_how(i) for i in range(len(tokens))]
        marks = {"fffd": "\ufffd", "bytes": "\x00GARBLED\x00"}
        text = "".join(tok + marks[g] if g else tok for tok, g in zip(tokens, garble, strict=True))
        finish: str | None = "stop" if self.mode == "empty" else job.finish_reason
        if self.mode == "truncated":
            finish = None
        choice: dict[str, Any]
        if job.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        body = {
            "id": f"chatcmpl-{job.request_id}" if job.chat else f"cmpl-{job.request_id}",
            "object": "chat.completion" if job.chat else "text_completion",
            "created": job.created,
            "model": model,
            "choices": [choice],
            "usage": _usage(job, len(tokens)),
        }
        if self.mode == "error_in_stream":  # a 200 whose body is an error object
            body = self._fault_error()
        payload = json.dumps(body, ensure_ascii=False).encode()
        payload = payload.replace(b"\\u0000GARBLED\\u0000", b"\xff\xfe")
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        if self.mode == "reset_after_k":  # half the body, then the caller aborts the connection
            half = payload[: len(payload) // 2]
            await send({"type": "http.response.body", "body": half, "more_body": True})
            return
        await send({"type": "http.response.body", "body": payload, "more_body": False})


def _sse(obj: dict[str, Any]) -> Message:
    data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return {"type": "http.response.body", "body": f"data: {data}\n\n".encode(), "more_body": True}


def _content_text(content: Any) -> str:
    """Text of a chat message ``content`` (string, or list of parts with ``text``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    raise RequestError(400, "message content must be a string or a list of content parts")


def _parse_job(body: Any, chat: bool, request_id: str, config: EngineConfig) -> _Job:
    """Validate a completion request body into a job.

    Raises:
        RequestError: 400 on any invalid field.
    """
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "'messages' is required and must be a non-empty list")
        texts = []
        for msg in messages:
            if not isinstance(msg, dict) or "role" not in msg:
                raise RequestError(400, "each message must be an object with a 'role'")
            texts.append(_content_text(msg.get("content")))
        prompt_tokens = count_text_tokens("".join(texts))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt_tokens = count_text_tokens(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
            prompt_tokens = len(prompt)
        elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt_tokens = count_text_tokens(prompt[0])
        else:
            raise RequestError(
                400, "'prompt' is required: a string, a one-element string list or token ids"
            )
    max_tokens: Any = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is None:
        n, finish = config.output_tokens, "stop"  # natural end of generation
    elif isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 1:
        n, finish = max_tokens, "length"
    else:
        raise RequestError(400, "max_tokens must be an integer >= 1")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, "'stream' must be a boolean")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise RequestError(400, "'stream_options' must be an object")
    if opts and not stream:
        raise RequestError(400, "Stream options can only be defined when `stream=True`.")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise RequestError(400, "'ignore_eos' must be a boolean")
    return _Job(
        request_id=request_id,
        chat=chat,
        stream=stream,
        include_usage=bool(opts.get("include_usage", False)),
        prompt_tokens=prompt_tokens,
        max_tokens=n,
        finish_reason=finish,
        arrival=time.perf_counter(),
    )


class _HeadersMiddleware:
    """Adds ``X-Replica-Id`` and echoes/creates ``X-Request-Id`` on every HTTP response."""

    def __init__(self, app: ASGIApp, replica_id: str) -> None:
        self.app = app
        self.replica = replica_id.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = ""
        for k, v in scope["headers"]:
            if k == b"x-request-id":
                rid = v.decode("latin-1")
                break
        if not rid:
            rid = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        extra = [(b"x-replica-id", self.replica), (b"x-request-id", rid.encode("latin-1"))]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_wrapper)


def build_app(config: EngineConfig) -> Starlette:
    """Build the engine's ASGI app.

    The simulated weight load starts when this is called (``load_delay_s`` from now).

    Args:
        config: engine configuration.

    Returns:
        A Starlette app; ``app.state.engine`` holds the engine state.

    Raises:
        OSError: when the ledger file cannot be opened.
    """
    engine = _Engine(config)

    async def completions(request: Request, chat: bool) -> Any:
        if not engine.ready():
            return _error_response(503, "model is loading")
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error_response(400, f"invalid JSON body: {exc}")
        try:
            job = _parse_job(body, chat, request.state.request_id, config)
            fault = None
            if config.admin_faults:
                header = request.headers.get(FAULT_HEADER)
                if header is not None and config.admin_token is not None:
                    denied = admin_allowed(
                        config, request.client, request.headers.get(ADMIN_TOKEN_HEADER)
                    )
                    if denied is not None:
                        raise RequestError(403, f"{FAULT_HEADER}: {denied}")
                fault = engine.choose_fault(header, job.prompt_tokens)
        except RequestError as exc:
            return _error_response(exc.status, exc.message)
        if fault is not None:
            engine.record_fault(fault, job.request_id)
            if fault.mode == "crash_on_long_prompt":
                engine.crash(fault, job.prompt_tokens)
            if fault.mode == "hang":  # engine loop dead: accepted, never answered
                return _HangResponse(engine.hung, fault)
        ticket = engine.scheduler.try_admit()
        if ticket is None:
            return _error_response(config.queue_full_status, "waiting queue is full")
        return _GenerationResponse(engine, job, ticket, fault)

    async def chat_completions(request: Request) -> Any:
        return await completions(request, chat=True)

    async def text_completions(request: Request) -> Any:
        return await completions(request, chat=False)

    async def health(request: Request) -> Response:
        if engine.ready():
            return Response(status_code=200)
        return _error_response(503, "model is loading")

    async def models(request: Request) -> Response:
        if not engine.ready():
            return _error_response(503, "model is loading")
        card = {
            "id": config.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": config.model,
            "parent": None,
            "max_model_len": config.kv_cache_tokens,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def metrics(request: Request) -> Response:
        data = generate_latest(engine.metrics.registry)
        return Response(data, media_type=CONTENT_TYPE_LATEST)

    async def admin_faults(request: Request) -> Response:
        # Lab-only endpoint (see "Fault modes"): the lab's token or loopback peers only, off
        # with --no-admin-faults.
        if not config.admin_faults:
            return _error_response(404, "fault injection is disabled (--no-admin-faults)")
        denied = admin_allowed(config, request.client, request.headers.get(ADMIN_TOKEN_HEADER))
        if denied is not None:
            return _error_response(403, denied)
        if request.method == "POST":
            try:
                fields = json.loads(await request.body())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                return _error_response(400, f"invalid JSON body: {exc}")
            try:
                spec = parse_fault(fields)
            except RequestError as exc:
                return _error_response(exc.status, exc.message)
            if isinstance(fields.get("seed"), int):
                engine.faults.rng.seed(fields["seed"])
            spec.served_at_set = engine.generations_started
            engine.faults.set(spec)
            engine.record_admin("set", [spec])
        elif request.method == "DELETE":
            mode = request.query_params.get("mode")
            if mode is not None:
                mode = mode.strip().lower().replace("-", "_")
                if mode not in FAULT_PARAMS:
                    return _error_response(400, f"unknown fault mode {mode!r}")
            cleared = engine.faults.clear(mode)
            released = engine.release_hung() if mode in (None, "hang") else 0
            engine.record_admin("clear", cleared)
            return JSONResponse(
                {
                    "replica": config.replica_id,
                    "pid": os.getpid(),
                    "cleared": [f.to_json() for f in cleared],
                    "released_hung_requests": released,
                    "faults": [f.to_json() for f in engine.faults.active()],
                }
            )
        out: dict[str, Any] = {
            "replica": config.replica_id,
            "pid": os.getpid(),
            "faults": [f.to_json() for f in engine.faults.active()],
            "modes": list(FAULT_MODES),
        }
        if request.method == "POST":
            out["fault"] = spec.to_json()
        return JSONResponse(out)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        engine.close()

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", text_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/admin/faults", admin_faults, methods=["GET", "POST", "DELETE"]),
        ],
        lifespan=lifespan,
    )
    app.state.engine = engine
    logging.getLogger("uvicorn.error").addFilter(_ABORT_LOG_FILTER)
    app.add_middleware(_HeadersMiddleware, replica_id=config.replica_id)  # type: ignore[arg-type]
    from chaoslib_infer.lab.mimic import ENGINE_KEY_ENV, MimicMiddleware

    if config.profile is not None or os.environ.get(ENGINE_KEY_ENV):  # provider mimic mode
        app.add_middleware(
            MimicMiddleware,  # type: ignore[arg-type]
            profile=config.profile or "vllm",
            api_key=os.environ.get(ENGINE_KEY_ENV),
            model=config.model,
        )
    return app


def _tune_malloc() -> None:
    """Fix glibc's mmap threshold so freed KV blocks go back to the OS (Linux/glibc only)."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD; also disables the dynamic threshold


class _CheckingParser(argparse.ArgumentParser):
    """An argument parser whose errors raise ``ValueError`` instead of exiting (``check_args``)."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def check_args(argv: list[str]) -> None:
    """Check engine flags without starting anything (the lab does, before it starts a replica).

    ``--admin-token-file`` is not read.

    Args:
        argv: the flags (an engine command line after ``-m chaoslib_infer.lab.engine``).

    Raises:
        ValueError: an unknown flag or a value the engine would refuse (argparse's or
            :class:`EngineConfig`'s message, one line).
    """
    p = _build_parser(_CheckingParser)
    a = p.parse_args(argv)
    _config(a, p, admin_token=None)


def parse_args(argv: list[str] | None = None) -> EngineConfig:
    """Parse CLI flags into an :class:`EngineConfig`.

    Args:
        argv: arguments (default ``sys.argv[1:]``).

    Returns:
        The configuration.

    Raises:
        SystemExit: on invalid flags (argparse), an unreadable ``--admin-token-file`` or a token
            shorter than 16 characters.
    """
    p = _build_parser(argparse.ArgumentParser)
    a = p.parse_args(argv)
    admin_token: str | None = None
    if a.admin_token_file is not None:
        try:
            lines = a.admin_token_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            p.error(f"--admin-token-file {a.admin_token_file}: cannot read it: {exc}")
        admin_token = lines[0].strip() if lines else ""
        if len(admin_token) < 16:
            p.error(f"--admin-token-file {a.admin_token_file}: needs a token of 16+ characters")
    return _config(a, p, admin_token)


def _build_parser(cls: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    d = EngineConfig()
    p = cls(
        prog="python -m chaoslib_infer.lab.engine",
        description="Simulated vLLM-like OpenAI-compatible inference server for the chaos lab.",
    )
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port, help="0 picks a free port (logged)")
    p.add_argument("--replica-id", default=d.replica_id)
    p.add_argument("--ledger", type=Path, default=None, help="generation ledger (JSON lines)")
    p.add_argument("--model", default=d.model)
    p.add_argument("--load-delay-s", type=float, default=d.load_delay_s)
    p.add_argument("--warmup-requests", type=int, default=d.warmup_requests)
    p.add_argument("--warmup-penalty-s", type=float, default=d.warmup_penalty_s)
    p.add_argument("--prefill-s-per-token", type=float, default=d.prefill_s_per_token)
    p.add_argument("--itl-s", type=float, default=d.itl_s)
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    p.add_argument("--max-waiting", type=int, default=d.max_waiting)
    p.add_argument("--queue-full-status", type=int, choices=(429, 503), default=d.queue_full_status)
    p.add_argument("--kv-bytes-per-token", type=int, default=d.kv_bytes_per_token)
    p.add_argument("--kv-cache-tokens", type=int, default=d.kv_cache_tokens)
    p.add_argument("--zero-latency", action="store_true", help="no delays at all")
    p.add_argument("--output-tokens", type=int, default=d.output_tokens)
    p.add_argument("--graceful-shutdown-s", type=float, default=d.graceful_shutdown_s)
    p.add_argument(
        "--no-admin-faults",
        dest="admin_faults",
        action="store_false",
        help="disable the lab-only /admin/faults endpoint and the X-Chaos-Fault header",
    )
    p.add_argument(
        "--admin-token-file", type=Path, default=None, metavar="FILE",
        help="lab admin token (first line of FILE): /admin/faults and X-Chaos-Fault then need "
        "it in X-Chaos-Admin-Token from every peer (default: loopback peers only)",
    )  # fmt: skip
    p.add_argument(
        "--profile", choices=("vllm", "sglang", "tgi", "trtllm", "ark", "openai"),
        default=d.profile, help="answer like this provider (routes, auth, error shapes, stream "
        "chunks; chaoslib_infer.lab.mimic); key from $CHAOS_INFER_ENGINE_API_KEY",
    )  # fmt: skip
    p.add_argument(
        "--ttft-log", type=Path, default=None,
        help="append one JSON line per first token: request_id, server-side ttft_s, t (unix s), "
        "and kernel times of request in / first token out (rx_at, tx_at, ttft_kernel_s: "
        "chaoslib_infer.lab.kernel_stamps)",
    )  # fmt: skip
    return p


def _config(
    a: argparse.Namespace, p: argparse.ArgumentParser, admin_token: str | None
) -> EngineConfig:
    try:
        return EngineConfig(
            host=a.host,
            port=a.port,
            replica_id=a.replica_id,
            ledger=a.ledger,
            model=a.model,
            load_delay_s=a.load_delay_s,
            warmup_requests=a.warmup_requests,
            warmup_penalty_s=a.warmup_penalty_s,
            prefill_s_per_token=a.prefill_s_per_token,
            itl_s=a.itl_s,
            max_num_seqs=a.max_num_seqs,
            max_waiting=a.max_waiting,
            queue_full_status=a.queue_full_status,
            kv_bytes_per_token=a.kv_bytes_per_token,
            kv_cache_tokens=a.kv_cache_tokens,
            zero_latency=a.zero_latency,
            output_tokens=a.output_tokens,
            graceful_shutdown_s=a.graceful_shutdown_s,
            admin_faults=a.admin_faults,
            admin_token=admin_token,
            profile=a.profile,
            ttft_log=a.ttft_log,
        )
    except ValueError as exc:
        p.error(str(exc))
        raise  # unreachable: p.error exits


def main(argv: list[str] | None = None) -> None:
    """Run the engine until SIGTERM/SIGINT.

    Logs one line to stderr once the socket is bound:
    ``lab-engine listening replica=R pid=P host=H port=N model=M load_delay_s=S``.

    Args:
        argv: CLI arguments (default ``sys.argv[1:]``).

    Raises:
        SystemExit: on invalid flags; OSError when the port cannot be bound.
    """
    import uvicorn

    config = parse_args(argv)
    _tune_malloc()
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    sock.set_inheritable(True)
    port = sock.getsockname()[1]
    app = build_app(config)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            loop="uvloop",
            http=kernel_stamps.protocol_class() if config.ttft_log is not None else "httptools",
            access_log=False,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=math.ceil(config.graceful_shutdown_s),
        )
    )
    print(
        f"lab-engine listening replica={config.replica_id} pid={os.getpid()} "
        f"host={config.host} port={port} model={config.model} "
        f"load_delay_s={config.load_delay_s}",
        file=sys.stderr,
        flush=True,
    )
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
