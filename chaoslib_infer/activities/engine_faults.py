"""Actions that make the lab's simulated engine misbehave (engine fault modes).

Faults are armed through each replica's lab-only admin endpoint (``POST /admin/faults`` on the
replica's own loopback port, see :mod:`chaoslib_infer.lab.engine`, "Fault modes"); every sabotaged
request then gets an ``"event": "fault"`` line in the lab's engine ledger (ground truth).

Modes and what a client sees (the load client's error class):

======================== ===================================================================
``hang``                 accepted, never a byte; ``/health`` stays 200 -> ``timeout_ttft``
``reset_after_k``        ``k`` tokens, then a TCP reset -> ``reset``
``stall``                ``k`` tokens, ``t`` s of silence, then the rest -> ``timeout_idle``
                         when ``t`` exceeds the client's idle timeout
``error_in_stream``      ``k`` tokens, then an OpenAI error object in the 200 stream -> ``stream_error``
``empty``                no content, ``finish_reason`` "stop" -> ``empty``
``garbled``              U+FFFD (``how=fffd``) and/or invalid UTF-8 (``bytes``) -> ``garbled``
``truncated``            ``k`` tokens, clean end without finish_reason / ``[DONE]`` -> ``truncated``
``slowdown``             ITL x (1 + ``factor`` x requests served since set): latency SLOs
``crash_on_long_prompt`` a prompt over ``n`` tokens kills the replica -> ``reset`` (direct) or
                         ``http_5xx`` (through HAProxy); supervisord restarts it
======================== ===================================================================

Each armed fault is recorded with ``lab.add_fault`` *before* the admin call; this module's
:func:`undo_fault` / :func:`fault_active` let ``clear_lab_faults`` and ``chaos-infer lab status``
undo and report it. The sim engine only: other engines have no admin endpoint.
"""

from __future__ import annotations

import http.client
import json
import time
from typing import Any
from urllib.parse import quote

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer.activities.lab import _lab, _log_fault
from chaoslib_infer.lab.engine import FAULT_MODES
from chaoslib_infer.lab.fleet import FAULTS_FILE, Lab, LabError

__all__ = ["clear_engine_faults", "set_engine_fault"]

KIND = "engine-fault"
MODULE = "chaoslib_infer.activities.engine_faults"
ADMIN_PATH = "/admin/faults"
_TIMEOUT_S = 3.0


class _Dead(Exception):
    """The replica's port refuses connections (no process listening)."""


def _admin(
    port: int,
    method: str,
    query: str = "",
    body: dict[str, Any] | None = None,
    host: str = "127.0.0.1",
) -> dict[str, Any]:
    """Call a replica's ``/admin/faults``; returns the JSON answer.

    Raises:
        _Dead: connection refused (the replica is not running).
        LabError: any other transport failure or a non-200 answer (message from the engine).
    """
    conn = http.client.HTTPConnection(host, int(port), timeout=_TIMEOUT_S)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        conn.request(method, ADMIN_PATH + query, body=payload, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
    except ConnectionRefusedError as exc:
        raise _Dead(str(exc)) from exc
    except (OSError, http.client.HTTPException) as exc:
        raise LabError(
            f"{method} {ADMIN_PATH} on port {port}: {exc or type(exc).__name__}"
        ) from exc
    finally:
        conn.close()
    try:
        data = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        data = {}
    if resp.status != 200:
        err = data.get("error") if isinstance(data, dict) else None
        msg = err.get("message") if isinstance(err, dict) else raw[:200].decode(errors="replace")
        raise LabError(f"{method} {ADMIN_PATH} on port {port}: HTTP {resp.status}: {msg}")
    return data if isinstance(data, dict) else {}


def _port(lab: Lab, replica: str) -> int:
    for rep in lab.meta.get("replicas", []):
        if rep.get("name") == replica:
            return int(rep["port"])
    raise ActivityFailed(
        f"unknown replica {replica!r}; the lab has {', '.join(lab.replica_names())}"
    )


def _replicas(lab: Lab, replica: str, default_all: bool) -> list[str]:
    names = lab.replica_names()
    if not names:
        raise ActivityFailed("the lab has no replica")
    if replica in ("auto", "", None):
        return list(names) if default_all else names[:1]
    if replica == "all":
        return list(names)
    if replica not in names:
        raise ActivityFailed(f"unknown replica {replica!r}; the lab has {', '.join(names)}")
    return [replica]


def _recorded_ids(lab: Lab, replica: str) -> list[str]:
    """Ids of this kind's records in the lab's fault ledger for ``replica``."""
    try:
        faults = json.loads((lab.state_dir / FAULTS_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return []
    return [
        str(f["id"])
        for f in faults
        if isinstance(f, dict)
        and f.get("kind") == KIND
        and f.get("replica") == replica
        and f.get("id")
    ]


def undo_fault(lab: Lab, record: dict[str, Any]) -> str | None:
    """Disarm an engine fault (``DELETE /admin/faults?mode=...`` on its replica). Idempotent.

    A replica that is not running holds no fault (a restarted engine starts clean): that counts as
    undone.

    Returns:
        What was undone, or ``None`` when nothing was armed any more.

    Raises:
        LabError: the replica answered with an error or not at all (the fault may still be armed).
    """
    mode = str(record.get("mode") or "")
    query = f"?mode={quote(mode)}" if mode else ""
    try:
        answer = _admin(
            int(record["port"]), "DELETE", query, host=str(record.get("host", "127.0.0.1"))
        )
    except _Dead:
        return f"engine-fault {mode} on {record.get('replica')}: replica not running, nothing armed"
    cleared = [f.get("mode") for f in answer.get("cleared", [])]
    if not cleared:
        return None
    return f"engine-fault on {record.get('replica')}: disarmed {', '.join(map(str, cleared))}"


def fault_active(lab: Lab, record: dict[str, Any]) -> bool:
    """True while the replica's engine still has the record's mode armed (``GET /admin/faults``).

    A replica that is not running has nothing armed. Raises on any other failure to ask, so the
    lab reports the fault as active rather than hiding it.
    """
    try:
        answer = _admin(int(record["port"]), "GET", host=str(record.get("host", "127.0.0.1")))
    except _Dead:
        return False
    modes = {f.get("mode") for f in answer.get("faults", [])}
    return record.get("mode") in modes if record.get("mode") else bool(modes)


def set_engine_fault(
    mode: str,
    replica: str = "auto",
    probability: float = 1.0,
    ttl_s: float | None = None,
    params: dict[str, Any] | None = None,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Arm an engine fault mode on one replica (or ``"all"``) of the lab's sim engine.

    The fault is recorded with ``lab.add_fault`` before the admin call (so a rollback can always
    undo it) and logged to the drill's fault log as ``{"kind": "engine-fault", "phase": "set",
    "fault_at", "replica", "mode", "port", "probability", "ttl_s", "params", "fault_id"}``.

    Args:
        mode: one of ``hang``, ``reset_after_k``, ``stall``, ``error_in_stream``, ``empty``,
            ``garbled``, ``truncated``, ``slowdown``, ``crash_on_long_prompt``.
        replica: replica name, ``"auto"`` (the first replica) or ``"all"``.
        probability: chance (0..1) that each request it applies to is sabotaged.
        ttl_s: seconds until the engine disarms it by itself (None: until cleared).
        params: the mode's parameters: ``k`` (tokens sent first), ``t`` (stall seconds), ``n``
            (prompt-token threshold), ``factor`` (slowdown per request), ``how`` (``garbled``:
            fffd|bytes|both; ``crash_on_long_prompt``: exit|kill).
        configuration: Chaos Toolkit configuration (``infer_lab_dir``, ``infer_run_dir``).

    Returns:
        ``{"mode", "fault_at" (unix s), "replicas": [names], "faults": [engine's description]}``.

    Raises:
        ActivityFailed: no lab, unknown replica or mode, not the sim engine, or the engine refused
            the fault (the lab record is removed again).
    """
    mode_n = str(mode).strip().lower().replace("-", "_")
    if mode_n not in FAULT_MODES:
        raise ActivityFailed(f"unknown engine fault mode {mode!r}; known: {', '.join(FAULT_MODES)}")
    lab = _lab(configuration)
    if lab.engine_name() != "sim":
        raise ActivityFailed(f"engine faults need the sim engine; the lab runs {lab.engine_name()}")
    body: dict[str, Any] = {"mode": mode_n, **(params or {}), "probability": float(probability)}
    if ttl_s is not None and str(ttl_s).strip() != "":
        body["ttl_s"] = float(ttl_s)
    described: list[dict[str, Any]] = []
    names = _replicas(lab, replica, default_all=False)
    fault_at = time.time()
    for name in names:
        port = _port(lab, name)
        host = lab.replica_host(name)
        record = {
            "kind": KIND,
            "module": MODULE,
            "replica": name,
            "port": port,
            "host": host,
            "mode": mode_n,
        }
        fault_id = lab.add_fault(record)
        try:
            answer = _admin(port, "POST", body=body, host=host)
        except (LabError, _Dead) as exc:
            lab.remove_fault(fault_id, undo=False)
            raise ActivityFailed(f"engine fault {mode_n} on {name} refused: {exc}") from exc
        fault = dict(answer.get("fault") or {})
        fault_at = float(fault.get("set_at") or time.time())
        described.append({"replica": name, **fault})
        _log_fault(
            configuration,
            {
                "kind": KIND,
                "phase": "set",
                "fault_at": fault_at,
                "replica": name,
                "port": port,
                "mode": mode_n,
                "probability": float(probability),
                "ttl_s": body.get("ttl_s"),
                "params": {k: v for k, v in fault.items() if k in ("k", "t", "n", "factor", "how")},
                "fault_id": fault_id,
            },
        )
    return {"mode": mode_n, "fault_at": fault_at, "replicas": names, "faults": described}


def clear_engine_faults(
    replica: str = "all", configuration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Rollback: disarm every engine fault on the replicas (``DELETE /admin/faults``).

    Forgets the matching ``engine-fault`` records of the lab's fault ledger and logs
    ``{"kind": "engine-fault", "phase": "cleared", "fault_at", "replica", "mode": "all"}`` per
    replica. Safe to call when nothing is armed, when a replica is down, or without a lab.

    Args:
        replica: replica name, ``"all"`` or ``"auto"`` (both: every replica).
        configuration: Chaos Toolkit configuration.

    Returns:
        ``{"cleared": [descriptions], "replicas": [names]}``.

    Raises:
        ActivityFailed: a replica answered but refused to clear (its fault stays recorded).
    """
    try:
        lab = _lab(configuration)
    except ActivityFailed:
        return {"cleared": [], "replicas": []}
    names = _replicas(lab, replica, default_all=True)
    notes: list[str] = []
    errors: list[str] = []
    for name in names:
        port = _port(lab, name)
        try:
            note = undo_fault(
                lab, {"replica": name, "port": port, "host": lab.replica_host(name), "mode": ""}
            )
        except LabError as exc:
            errors.append(str(exc))
            continue
        if note:
            notes.append(note)
        for fault_id in _recorded_ids(lab, name):
            lab.remove_fault(fault_id, undo=False)  # already disarmed above
        _log_fault(
            configuration,
            {
                "kind": KIND,
                "phase": "cleared",
                "fault_at": time.time(),
                "replica": name,
                "mode": "all",
            },
        )
    if errors:
        raise ActivityFailed("; ".join(errors))
    return {"cleared": notes, "replicas": names}
