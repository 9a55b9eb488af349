"""Actions that make the lab's simulated engine misbehave (engine fault modes).

Faults are armed through each replica's lab-only admin endpoint (``POST /admin/faults`` on the
address and port the replica listens on, with the lab's admin token:
:mod:`chaoslib_infer.lab.engine_admin`), so they work on every lab topology, replicas on loopback
or on network-namespace nodes; every sabotaged request then gets an ``"event": "fault"`` line in
the lab's engine ledger (ground truth).

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
                         ``http_5xx`` (through HAProxy); supervisord restarts it, and the
                         restarted engine re-arms it (a deterministic bug: kept in
                         ``<state_dir>/engine-faults/<replica>.json`` until cleared)
``http_error``           an HTTP error a provider really answers (``how``: ``rate_limit`` 429
                         and ``unavailable`` 503 with ``Retry-After: retry_after``,
                         ``server_error`` 500, ``closed_endpoint`` 400 retryable (Ark's
                         ``InvalidEndpoint.ClosedEndpoint``), ``bad_request`` 400 final), in
                         the error shape of ``profile``, ``burst`` requests in a row per hit
                         -> ``http_429`` / ``http_5xx`` / ``http_4xx`` (``lab.engine.errors``)
======================== ===================================================================

Each armed fault is recorded with ``lab.add_fault`` *before* the admin call: the lab's rollback
ledger (``faults.json``) and ground-truth events ``{"event": "fault", "kind": "engine-fault",
"phase": "injected" | "cleared", "replica", "mode", "fault_id"}`` in ``events.jsonl``. This
module's :func:`undo_fault` / :func:`fault_active` let ``clear_lab_faults``, ``chaos-infer
rollback`` and the lab's dead-man watchdog undo it (the watchdog at the latest ``ttl_s`` +
:data:`TTL_MARGIN_S` after it was armed, or :data:`~chaoslib_infer.lab.fleet.DEFAULT_FAULT_TTL_S`
without ``ttl_s``), and ``chaos-infer lab status`` report it. The sim engine only: other engines
have no admin endpoint.

From an experiment: ``experiments/engine-fault.yaml`` arms one mode under load for ``hold_s``
seconds, then clears it, with :func:`clear_engine_faults` as its rollback; a plan runs it as a
drill with the mode in its ``vars`` (``engine_fault_mode``, ``engine_fault_params``, ...).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer.lab import engine_admin
from chaoslib_infer.lab.activity import attach_lab, log_fault
from chaoslib_infer.lab.engine import FAULT_MODES
from chaoslib_infer.lab.engine.faults import read_persisted, write_persisted
from chaoslib_infer.lab.engine_admin import ReplicaNotRunning
from chaoslib_infer.lab.fleet import DEFAULT_FAULT_TTL_S, FAULTS_FILE, Lab, LabError
from chaoslib_infer.lab.statedir import ENGINE_FAULTS_DIR

__all__ = ["clear_engine_faults", "set_engine_fault"]

KIND = "engine-fault"
MODULE = "chaoslib_infer.activities.engine_faults"
ADMIN_PATH = engine_admin.ADMIN_PATH
#: seconds the lab's dead-man waits past a fault's own ``ttl_s`` before it disarms it itself
TTL_MARGIN_S = 5.0
#: Fault parameters copied into the journal's fault log (what the mode was armed with).
FAULT_PARAMS_LOGGED = ("k", "t", "n", "factor", "how", "retry_after", "burst", "profile")


def _admin(
    lab: Lab,
    record: dict[str, Any],
    method: str,
    query: str = "",
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Call ``/admin/faults`` of the replica a fault record names, with the lab's admin token.

    The address is where the replica listens *now* (a node-loss drill may have moved it to the
    spare node), else the record's ``host``.

    Raises:
        ReplicaNotRunning: connection refused (the replica is not running).
        LabError: any other transport failure or a non-200 answer (message from the engine).
    """
    host = str(record.get("host") or "127.0.0.1")
    if record.get("replica"):
        try:
            host = lab.replica_host(str(record["replica"]))
        except (LabError, OSError, ValueError):
            pass
    return engine_admin.call(
        host, int(record["port"]), method, query, body=body, token=lab.admin_token()
    )


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


def _params(params: Any) -> dict[str, Any]:
    """``params`` of :func:`set_engine_fault` as a mapping.

    Accepts a mapping, a JSON object string (``'{"k": 2, "t": 5}'``), the header form
    ``"k=2;t=5"`` (or ``"k=2,t=5"``; numbers become numbers), or nothing (``None``, ``""``).

    Raises:
        ActivityFailed: anything else (one line).
    """
    if params is None or params == "" or params == {}:
        return {}
    if isinstance(params, dict):
        return dict(params)
    if isinstance(params, str):
        text = params.strip()
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                value = None
            if isinstance(value, dict):
                return value
        else:
            out: dict[str, Any] = {}
            for part in text.replace(",", ";").split(";"):
                if not part.strip():
                    continue
                key, sep, val = part.partition("=")
                if not sep or not key.strip():
                    break
                out[key.strip()] = _scalar(val.strip())
            else:
                return out
    raise ActivityFailed(
        f"engine fault params must be a mapping, a JSON object or 'k=2;t=5', got {params!r}"
    )


def _scalar(text: str) -> Any:
    """``"2"`` -> 2, ``"8.5"`` -> 8.5, anything else stays text (``"bytes"``)."""
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            continue
    return text


def _number(name: str, value: Any, allow_none: bool) -> float | None:
    """A number argument that may come from a ``${var}`` string; None/""/"none" -> None.

    Raises:
        ActivityFailed: not a finite number (one line).
    """
    if allow_none and (
        value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null"))
    ):
        return None
    try:
        out = float("nan") if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        out = float("nan")
    if not math.isfinite(out):
        raise ActivityFailed(f"engine fault {name} must be a number, got {value!r}")
    return out


def _fault_file(lab: Lab, replica: str) -> Path:
    """The replica's fault-state file (crash faults its engine re-arms when it restarts)."""
    return lab.state_dir / ENGINE_FAULTS_DIR / f"{replica}.json"


def _persisted_modes(lab: Lab, record: dict[str, Any]) -> list[str]:
    """Modes of the record (all, without a ``mode``) kept in its replica's fault-state file."""
    if not record.get("replica"):
        return []
    mode = str(record.get("mode") or "")
    specs = read_persisted(_fault_file(lab, str(record["replica"])))
    return [f.mode for f in specs if not mode or f.mode == mode]


def _drop_persisted(lab: Lab, record: dict[str, Any]) -> list[str]:
    """Remove the record's mode (every mode, without one) from its replica's fault-state file,
    so a restart does not re-arm it; returns the modes removed.

    Raises:
        LabError: the file could not be rewritten (the fault would come back with a restart).
    """
    dropped = _persisted_modes(lab, record)
    if not dropped:
        return []
    path = _fault_file(lab, str(record["replica"]))
    keep = [f for f in read_persisted(path) if f.mode not in dropped]
    try:
        write_persisted(path, keep)
    except OSError as exc:
        raise LabError(f"engine-fault state {path}: not rewritten: {exc}") from exc
    return dropped


def undo_fault(lab: Lab, record: dict[str, Any]) -> str | None:
    """Disarm an engine fault (``DELETE /admin/faults?mode=...`` on its replica). Idempotent.

    A running engine disarms it and rewrites its fault-state file itself. A replica that is not
    running (a crash fault just killed it) holds the fault only in its fault-state file
    (``<state_dir>/engine-faults/<replica>.json``, :data:`~chaoslib_infer.lab.engine.faults.PERSISTENT_MODES`):
    the fault is removed from there, so the restarted replica does not re-arm it.

    Returns:
        What was undone, or ``None`` when nothing was armed any more.

    Raises:
        LabError: the replica answered with an error or not at all (the fault may still be armed).
    """
    mode = str(record.get("mode") or "")
    query = f"?mode={quote(mode)}" if mode else ""
    try:
        answer = _admin(lab, record, "DELETE", query)
    except ReplicaNotRunning:
        dropped = _drop_persisted(lab, record)
        if dropped:
            return (
                f"engine-fault on {record.get('replica')}: replica not running; "
                f"{', '.join(dropped)} removed from its fault-state file (not re-armed at restart)"
            )
        return f"engine-fault {mode} on {record.get('replica')}: replica not running, nothing armed"
    cleared = [f.get("mode") for f in answer.get("cleared", [])]
    if not cleared:
        return None
    return f"engine-fault on {record.get('replica')}: disarmed {', '.join(map(str, cleared))}"


def fault_active(lab: Lab, record: dict[str, Any]) -> bool:
    """True while the replica's engine still has the record's mode armed (``GET /admin/faults``).

    A replica that is not running has armed what its fault-state file keeps (its restart re-arms
    it). Raises on any other failure to ask, so the lab reports the fault as active rather than
    hiding it.
    """
    try:
        answer = _admin(lab, record, "GET")
    except ReplicaNotRunning:
        return bool(_persisted_modes(lab, record))
    modes = {f.get("mode") for f in answer.get("faults", [])}
    return record.get("mode") in modes if record.get("mode") else bool(modes)


def set_engine_fault(
    mode: str,
    replica: str = "auto",
    probability: float = 1.0,
    ttl_s: float | None = None,
    params: dict[str, Any] | str | None = None,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Arm an engine fault mode on one replica (or ``"all"``) of the lab's sim engine.

    Works on every lab topology (replicas on loopback or on nodes): the call carries the lab's
    admin token. The fault is recorded with ``lab.add_fault`` before the admin call (so a rollback,
    ``chaos-infer rollback`` or the lab's dead-man can always undo it; ground-truth event
    ``injected``) and logged to the drill's fault log as ``{"kind": "engine-fault", "phase": "set",
    "fault_at", "replica", "mode", "port", "probability", "ttl_s", "params", "fault_id"}``.

    Args:
        mode: one of ``hang``, ``reset_after_k``, ``stall``, ``error_in_stream``, ``empty``,
            ``garbled``, ``truncated``, ``slowdown``, ``crash_on_long_prompt``.
        replica: replica name, ``"auto"`` (the first replica) or ``"all"``.
        probability: chance (0..1) that each request it applies to is sabotaged.
        ttl_s: seconds until the engine disarms it by itself (None / ``""``: until cleared; the
            lab's dead-man disarms it after :data:`~chaoslib_infer.lab.fleet.DEFAULT_FAULT_TTL_S`
            anyway, and ``ttl_s`` + :data:`TTL_MARGIN_S` with one).
        params: the mode's parameters, a mapping, a JSON object string or ``"k=2;t=5"``: ``k``
            (tokens sent first), ``t`` (stall seconds), ``n`` (prompt-token threshold),
            ``factor`` (slowdown per request), ``how`` (``garbled``: fffd|bytes|both;
            ``crash_on_long_prompt``: exit|kill).
        configuration: Chaos Toolkit configuration (``infer_lab_dir``, ``infer_run_dir``).

    Returns:
        ``{"mode", "fault_at" (unix s), "replicas": [names], "faults": [engine's description]}``.

    Raises:
        ActivityFailed: no lab, unknown replica or mode, bad parameters, not the sim engine, or
            the engine refused the fault (the lab record is removed again).
    """
    mode_n = str(mode).strip().lower().replace("-", "_")
    if mode_n not in FAULT_MODES:
        raise ActivityFailed(f"unknown engine fault mode {mode!r}; known: {', '.join(FAULT_MODES)}")
    prob = _number("probability", probability, allow_none=False)
    ttl = _number("ttl_s", ttl_s, allow_none=True)
    if ttl is not None and ttl <= 0:
        raise ActivityFailed(f"engine fault ttl_s must be > 0 seconds, got {ttl_s!r}")
    lab = attach_lab(configuration)
    if lab.engine_name() != "sim":
        raise ActivityFailed(f"engine faults need the sim engine; the lab runs {lab.engine_name()}")
    body: dict[str, Any] = {"mode": mode_n, **_params(params), "probability": prob}
    if ttl is not None:
        body["ttl_s"] = ttl
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
            "ttl_s": ttl + TTL_MARGIN_S if ttl is not None else DEFAULT_FAULT_TTL_S,
        }
        fault_id = lab.add_fault(record)
        try:
            answer = _admin(lab, record, "POST", body=body)
        except LabError as exc:
            lab.remove_fault(fault_id, undo=False)
            raise ActivityFailed(f"engine fault {mode_n} on {name} refused: {exc}") from exc
        fault = dict(answer.get("fault") or {})
        fault_at = float(fault.get("set_at") or time.time())
        described.append({"replica": name, **fault})
        log_fault(
            configuration,
            {
                "kind": KIND,
                "phase": "set",
                "fault_at": fault_at,
                "replica": name,
                "port": port,
                "mode": mode_n,
                "probability": prob,
                "ttl_s": body.get("ttl_s"),
                "params": {k: v for k, v in fault.items() if k in FAULT_PARAMS_LOGGED},
                "fault_id": fault_id,
            },
        )
    return {"mode": mode_n, "fault_at": fault_at, "replicas": names, "faults": described}


def clear_engine_faults(
    replica: str = "all", configuration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Rollback: disarm every engine fault on the replicas (``DELETE /admin/faults``).

    Forgets the matching ``engine-fault`` records of the lab's fault ledger (ground-truth event
    ``cleared`` each) and logs ``{"kind": "engine-fault", "phase": "cleared", "fault_at",
    "replica", "mode": "all"}`` per replica. Safe to call when nothing is armed, when a replica is
    down, or without a lab.

    Args:
        replica: replica name, ``"all"`` or ``"auto"`` (both: every replica).
        configuration: Chaos Toolkit configuration.

    Returns:
        ``{"cleared": [descriptions], "replicas": [names]}``.

    Raises:
        ActivityFailed: a replica answered but refused to clear, or did not answer (its fault
            stays recorded, for ``chaos-infer rollback`` and the dead-man).
    """
    try:
        lab = attach_lab(configuration)
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
        log_fault(
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
