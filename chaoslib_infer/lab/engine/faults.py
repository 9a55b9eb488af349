"""Fault modes of the lab engine: parameters, parsing, the armed board, who may arm them."""

from __future__ import annotations

import hmac
import ipaddress
import json
import math
import os
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoslib_infer.lab.engine.config import EngineConfig
from chaoslib_infer.lab.engine.wire import RequestError

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
    "http_error",
)
#: Request header carrying the lab's admin token (see ``EngineConfig.admin_token``).
ADMIN_TOKEN_HEADER = "x-chaos-admin-token"
#: Request header sabotaging one request: ``X-Chaos-Fault: mode;k=3;t=2`` (see ``parse_fault_header``).
FAULT_HEADER = "x-chaos-fault"
#: Exit status of a replica that ``crash_on_long_prompt`` (``how=exit``) killed.
CRASH_EXIT_CODE = 70
#: Modes that outlive the process, like a deterministic bug in the engine's code: armed through
#: the admin endpoint they are kept in the replica's fault-state file (``--fault-state-dir``) and
#: re-armed by the restarted replica until cleared or expired. The other modes are run-time
#: states (a hung loop, a slow step) that a restart ends.
PERSISTENT_MODES: frozenset[str] = frozenset({"crash_on_long_prompt"})

#: Per mode: accepted parameters and their defaults (k: tokens sent first; t: stall seconds;
#: n: prompt-token threshold; factor: ITL growth per request served; how: variant; retry_after:
#: whole seconds of the ``Retry-After`` header, 0 for none; burst: consecutive requests answered
#: once the probability roll hits; profile: the provider whose error shape answers, "" for the
#: engine's own: ``errors.PROVIDER_ERRORS``).
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
    "http_error": {"how": "rate_limit", "retry_after": 2, "burst": 1, "profile": ""},
}
_FAULT_HOW: dict[str, tuple[str, ...]] = {
    "garbled": ("fffd", "bytes", "both"),
    "crash_on_long_prompt": ("exit", "kill"),
    "http_error": ("rate_limit", "unavailable", "server_error", "closed_endpoint", "bad_request"),
}
#: Provider profiles an ``http_error`` answer may take the shape of ("": the engine's own).
_PROFILES = ("", "vllm", "sglang", "tgi", "trtllm", "ark", "openai")
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
    #: requests of the current burst still to answer (``http_error``'s ``burst``)
    burst_left: int = field(default=0, repr=False)

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
    if key in ("k", "n", "retry_after", "burst"):
        if text:
            try:
                value = int(str(value), 10)
            except ValueError:
                raise bad from None
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise bad
        if key == "burst" and value < 1:
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
    if key == "profile":
        if not isinstance(value, str) or value.strip().lower() not in _PROFILES:
            raise RequestError(
                400, f"fault {mode}: profile must be one of {', '.join(_PROFILES[1:])}"
            )
        return value.strip().lower()
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


def persisted_json(spec: FaultSpec) -> dict[str, Any]:
    """How a fault of :data:`PERSISTENT_MODES` is kept in the fault-state file: ``{"mode",
    "params", "probability", "set_at", "expires_at" (unix s, None: never), "fault_id"}``."""
    remaining = spec.remaining_s()
    return {
        "mode": spec.mode,
        "params": dict(spec.params),
        "probability": spec.probability,
        "set_at": spec.set_at,
        "expires_at": None if remaining is None else time.time() + remaining,
        "fault_id": spec.fault_id,
    }


def read_persisted(path: Path, now: float | None = None) -> list[FaultSpec]:
    """The faults a replica's fault-state file keeps that have not expired (``now``: unix s).

    A missing, unreadable or malformed file (or entry) keeps nothing: the engine starts clean
    rather than refusing to start.
    """
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    now = time.time() if now is None else now
    out: list[FaultSpec] = []
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict) or e.get("mode") not in PERSISTENT_MODES:
            continue
        expires = e.get("expires_at")
        if isinstance(expires, int | float) and expires <= now:
            continue
        fields = {"mode": e["mode"], "params": e.get("params") or {}}
        fields["probability"] = e.get("probability", 1.0)
        if isinstance(expires, int | float):
            fields["ttl_s"] = expires - now
        try:
            spec = parse_fault(fields)
        except RequestError:
            continue
        spec.set_at = float(e.get("set_at") or spec.set_at)
        spec.fault_id = str(e.get("fault_id") or spec.fault_id)
        out.append(spec)
    return out


def write_persisted(path: Path, specs: list[FaultSpec]) -> None:
    """Keep the faults of ``specs`` in :data:`PERSISTENT_MODES` in ``path`` (atomic write;
    the file is removed when none is left).

    Raises:
        OSError: the file could not be written.
    """
    keep = [persisted_json(f) for f in specs if f.mode in PERSISTENT_MODES]
    if not keep:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(keep) + "\n", encoding="utf-8")
    os.replace(tmp, path)


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


class FaultBoard:
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
        """The first armed fault that applies to the request and wins its probability roll.

        A fault with a ``burst`` of *b* > 1 (``http_error``) answers the *b* - 1 requests after
        a winning roll without rolling again (a provider's rate limiter or a closed endpoint
        stays so for a while: the answers come in bursts, not spread alone).
        """
        for spec in self.active():
            if not spec.applies(prompt_tokens):
                continue
            if spec.burst_left > 0:
                spec.burst_left -= 1
                return spec
            if self.roll(spec):
                spec.burst_left = int(spec.params.get("burst", 1)) - 1
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
