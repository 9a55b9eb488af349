"""Client of the sim engine's fault control plane (``/admin/faults``), as the lab uses it.

Every sim replica the lab starts answers ``/admin/faults`` only to a request carrying the lab's
admin token (``X-Chaos-Admin-Token``; a random per-lab token in ``state_dir/admin-token``, mode
0600, state directory 0700; see :meth:`chaoslib_infer.lab.fleet.Lab.admin_token` and
:mod:`chaoslib_infer.lab.engine`, "Fault modes"). That is what lets the runner, the dead-man
watchdog, ``chaos-infer rollback`` and ``chaos-infer lab status`` reach a replica that listens on a
node address (a network namespace), where the caller is not a loopback peer, without opening the
endpoint to every client of the lab. A lab without a token file (started by an older version)
falls back to the engine's loopback-only rule.

Functions take the replica's ``host`` and ``port`` (the lab's ``replica_host`` / port): a replica
moved to another node (node-loss rescheduling) keeps its port and changes its host.
"""

from __future__ import annotations

import http.client
import json
from typing import TYPE_CHECKING, Any

from chaoslib_infer.lab.engine import ADMIN_TOKEN_HEADER
from chaoslib_infer.lab.statedir import LabError
from chaoslib_infer.safety.redact import clip

if TYPE_CHECKING:
    from chaoslib_infer.lab.fleet import Lab

__all__ = ["ADMIN_PATH", "ReplicaNotRunning", "armed", "call", "lab_engine_faults"]

ADMIN_PATH = "/admin/faults"
TIMEOUT_S = 3.0


class ReplicaNotRunning(LabError):
    """The replica's port refuses connections: no engine listening (it holds no fault)."""


def call(
    host: str,
    port: int,
    method: str,
    query: str = "",
    body: dict[str, Any] | None = None,
    token: str | None = None,
    timeout_s: float = TIMEOUT_S,
) -> dict[str, Any]:
    """One request to a replica's ``/admin/faults``; returns its JSON answer.

    Args:
        host: address the replica listens on (``127.0.0.1`` or its node's address).
        port: the replica's port.
        method: ``GET`` (list), ``POST`` (arm ``body``) or ``DELETE`` (disarm; ``query``
            ``?mode=M`` for one mode).
        query: query string, starting with ``?`` (or empty).
        body: JSON body of a ``POST``.
        token: the lab's admin token (``Lab.admin_token()``); None sends none.
        timeout_s: connect and read timeout in seconds.

    Raises:
        ReplicaNotRunning: connection refused.
        LabError: any other transport failure, or a non-200 answer (the engine's message; the
            token is never part of it).
    """
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        if token:
            headers[ADMIN_TOKEN_HEADER] = token
        conn.request(method, ADMIN_PATH + query, body=payload, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
    except ConnectionRefusedError as exc:
        raise ReplicaNotRunning(f"{host}:{port} refuses connections") from exc
    except (OSError, http.client.HTTPException) as exc:
        raise LabError(
            f"{method} {ADMIN_PATH} on {host}:{port}: {exc or type(exc).__name__}"
        ) from exc
    finally:
        conn.close()
    try:
        data = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        data = {}
    if resp.status != 200:
        err = data.get("error") if isinstance(data, dict) else None
        msg = (
            err.get("message") if isinstance(err, dict) else clip(raw.decode(errors="replace"), 200)
        )
        raise LabError(f"{method} {ADMIN_PATH} on {host}:{port}: HTTP {resp.status}: {msg}")
    return data if isinstance(data, dict) else {}


def armed(lab: Lab, replica: str, timeout_s: float = TIMEOUT_S) -> list[dict[str, Any]]:
    """The fault modes armed on one replica's engine right now (``GET /admin/faults``).

    Returns:
        The engine's descriptions (``{"id", "mode", <params>, "probability", "ttl_s", "source",
        "set_at", "expires_in_s"?}``); ``[]`` when the replica is not running.

    Raises:
        LabError: unknown replica, or the replica did not answer (state unknown).
    """
    rep = next((r for r in lab.meta.get("replicas", []) if r.get("name") == replica), None)
    if rep is None:
        raise LabError(f"unknown replica {replica!r}; the lab has {', '.join(lab.replica_names())}")
    try:
        answer = call(
            lab.replica_host(replica),
            int(rep["port"]),
            "GET",
            token=lab.admin_token(),
            timeout_s=timeout_s,
        )
    except ReplicaNotRunning:
        return []
    return [f for f in answer.get("faults", []) if isinstance(f, dict)]


def lab_engine_faults(lab: Lab, timeout_s: float = 1.0) -> dict[str, Any]:
    """Engine faults armed on every replica of a sim lab (what ``chaos-infer lab status`` lists).

    Asks each replica (standby ones included) itself, so a fault armed by hand or left behind
    without a ledger record shows too.

    Returns:
        ``{replica: [descriptions]}`` (see :func:`armed`), or ``{replica: {"error": "..."}}`` for a
        replica whose state could not be read; ``{}`` for a lab whose engine is not ``sim``.
    """
    if lab.engine_name() != "sim":
        return {}
    out: dict[str, Any] = {}
    for rep in lab.meta.get("replicas", []):
        name = str(rep.get("name"))
        try:
            out[name] = armed(lab, name, timeout_s)
        except LabError as exc:
            out[name] = {"error": str(exc)}
    return out
