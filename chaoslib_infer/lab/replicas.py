"""Replicas under control: start one (healthy, then enabled in HAProxy), stop one (maintenance,
drain, stop), and what serves now (supervisord states, HAProxy's ``engines`` backend, the queue
depth).

Used by the scaling faults and the autoscaler (:mod:`chaoslib_infer.lab.scaling`, which
re-exports the public names) and the capacity drills. Every function takes a running
:class:`~chaoslib_infer.lab.fleet.Lab` and uses its public surface only. All times are unix
seconds.
"""

from __future__ import annotations

import contextlib
import http.client
import time
import xmlrpc.client
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.lab.statedir import HAPROXY_SOCK, LabError
from chaoslib_infer.lab.supervisor_rpc import rpc, start_process

if TYPE_CHECKING:
    from chaoslib_infer.lab.fleet import Lab

__all__ = [
    "BACKEND",
    "all_names",
    "back_in_standby",
    "backend_rows",
    "haproxy_command",
    "in_maintenance",
    "max_concurrency_per_instance",
    "process_infos",
    "queue_depth",
    "serving_replicas",
    "standby_names",
    "start_replica",
    "stop_replica",
]

#: HAProxy backend of the lab's replicas
BACKEND = "engines"


# --------------------------------------------------------------------------------------------
# Runtime state: supervisord, HAProxy, engines
# --------------------------------------------------------------------------------------------
def standby_names(lab: Lab) -> list[str]:
    """Names of the lab's standby replicas (configured, not started at lab start)."""
    return [r["name"] for r in lab.meta["replicas"] if r.get("standby")]


def all_names(lab: Lab) -> list[str]:
    """Every configured replica, standby ones included (lab order)."""
    return [r["name"] for r in lab.meta["replicas"]]


def process_infos(lab: Lab) -> dict[str, dict[str, Any]]:
    """supervisord's process info by program name.

    Raises:
        LabError: supervisord not answering.
    """
    try:
        return {p["name"]: p for p in rpc(lab.state_dir, 2.0).supervisor.getAllProcessInfo()}
    except (OSError, xmlrpc.client.Error, http.client.HTTPException) as exc:
        raise LabError(f"supervisord of the lab in {lab.state_dir} not answering: {exc}") from exc


def backend_rows(lab: Lab) -> dict[str, dict[str, str]]:
    """``show stat`` rows of the ``engines`` backend, servers and ``BACKEND``, by svname."""
    return hap.backend_stat(lab.state_dir / HAPROXY_SOCK, BACKEND)


def haproxy_command(lab: Lab, command: str) -> None:
    """Run one HAProxy runtime-API command that answers nothing on success.

    Raises:
        LabError: HAProxy answered something (a refusal).
        OSError: the stats socket is not answering.
    """
    answer = hap.stats_command(lab.state_dir / HAPROXY_SOCK, command).strip()
    if answer:
        raise LabError(f"haproxy refused {command!r}: {answer.splitlines()[0]}")


def in_maintenance(row: dict[str, str] | None) -> bool:
    """True when a ``show stat`` row says the server is in maintenance (``MAINT``)."""
    return bool(row) and str((row or {}).get("status", "")).startswith("MAINT")


def serving_replicas(lab: Lab) -> list[str]:
    """Replicas that take traffic now: RUNNING under supervisord and not in HAProxy maintenance
    (lab order: initial replicas first, then standby).

    Raises:
        LabError: supervisord or HAProxy not answering.
    """
    infos = process_infos(lab)
    try:
        rows = backend_rows(lab)
    except OSError as exc:
        raise LabError(f"haproxy stats socket not answering: {exc}") from exc
    return [
        n
        for n in all_names(lab)
        if infos.get(n, {}).get("statename") == "RUNNING" and not in_maintenance(rows.get(n))
    ]


def _engine_waiting(host: str, port: int, timeout_s: float = 0.2) -> float | None:
    """Sum of ``vllm:num_requests_waiting`` on one engine's /metrics (None: no such metric)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        body = resp.read().decode(errors="replace")
        if resp.status != 200:
            return None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    total: float | None = None
    for line in body.splitlines():
        if line.startswith("vllm:num_requests_waiting"):
            with contextlib.suppress(ValueError, IndexError):
                total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    return total


def queue_depth(lab: Lab) -> dict[str, Any]:
    """One queue-depth sample: HAProxy backend ``qcur`` + every running engine's waiting requests.

    Returns:
        ``{"t" (unix s), "depth" (requests), "haproxy_qcur", "engines_waiting": {replica: n}}``.

    Raises:
        LabError: supervisord or HAProxy not answering.
    """
    t = time.time()
    infos = process_infos(lab)
    try:
        rows = backend_rows(lab)
    except OSError as exc:
        raise LabError(f"haproxy stats socket not answering: {exc}") from exc
    try:
        qcur = int(rows.get("BACKEND", {}).get("qcur") or 0)
    except ValueError:
        qcur = 0
    waiting: dict[str, float] = {}
    for rep in lab.meta["replicas"]:
        if infos.get(rep["name"], {}).get("statename") != "RUNNING":
            continue
        w = _engine_waiting(lab.replica_host(rep["name"]), int(rep["port"]))
        if w is not None:
            waiting[rep["name"]] = w
    return {
        "t": t,
        "depth": qcur + sum(waiting.values()),
        "haproxy_qcur": qcur,
        "engines_waiting": waiting,
    }


def max_concurrency_per_instance(lab: Lab) -> int:
    """Concurrent requests one replica serves (``max_concurrency_per_instance`` of the capacity
    formula): the engine's ``max_num_seqs`` (sim engine default 16); 1 for the llama.cpp server,
    which serves one request at a time, unless ``max_num_seqs`` is given in the engine args."""
    args = lab.meta.get("engine_args") or {}
    if "max_num_seqs" in args:
        return int(args["max_num_seqs"])
    if lab.engine_name() == "sim":
        from chaoslib_infer.lab.engine import EngineConfig

        return EngineConfig().max_num_seqs
    return 1


# --------------------------------------------------------------------------------------------
# Starting and stopping replicas
# --------------------------------------------------------------------------------------------
def _healthy(lab: Lab, name: str) -> bool:
    port = int(lab.replica(name)["port"])
    conn = http.client.HTTPConnection(lab.replica_host(name), port, timeout=0.25)
    try:
        conn.request("GET", str(lab.meta.get("health_path") or "/health"))
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _rpc_start(lab: Lab, name: str) -> None:
    try:
        start_process(lab.state_dir, name)
    except xmlrpc.client.Fault as exc:
        raise LabError(f"supervisord could not start {name}: {exc.faultString}") from exc
    except (OSError, http.client.HTTPException) as exc:
        raise LabError(f"supervisord not answering while starting {name}: {exc}") from exc


def start_replica(
    lab: Lab, name: str, timeout_s: float = 30.0, keep_going: Callable[[], bool] | None = None
) -> dict[str, Any]:
    """Start a stopped replica through supervisord, wait until it is healthy, enable it in HAProxy.

    Args:
        lab: the lab.
        name: replica name (initial or standby).
        timeout_s: seconds to wait for the health endpoint.
        keep_going: optional callable checked while waiting; when it returns False the start is
            abandoned (the replica is stopped again) and ``enabled_at`` is None.

    Returns:
        ``{"replica", "started_at", "ready_at", "enabled_at"}`` (unix s).

    Raises:
        LabError: unknown replica, supervisord/HAProxy error, or not healthy within ``timeout_s``.
    """
    lab.replica(name)
    started_at = time.time()
    _rpc_start(lab, name)
    deadline = time.monotonic() + timeout_s
    while not _healthy(lab, name):
        if keep_going is not None and not keep_going():
            stop_replica(lab, name, drain_timeout_s=0.0)
            return {"replica": name, "started_at": started_at, "ready_at": None, "enabled_at": None}
        state = process_infos(lab).get(name, {}).get("statename")
        if state in ("FATAL", "BACKOFF"):
            raise LabError(f"{name} failed to start ({state}); see {lab.state_dir}/logs/{name}.log")
        if time.monotonic() > deadline:
            raise LabError(f"{name} not healthy within {timeout_s:g} s of its start")
        time.sleep(0.02)
    ready_at = time.time()
    if keep_going is not None and not keep_going():
        stop_replica(lab, name, drain_timeout_s=0.0)
        return {"replica": name, "started_at": started_at, "ready_at": ready_at, "enabled_at": None}
    haproxy_command(lab, f"set server {BACKEND}/{name} state ready")
    return {
        "replica": name,
        "started_at": started_at,
        "ready_at": ready_at,
        "enabled_at": time.time(),
    }


def stop_replica(lab: Lab, name: str, drain_timeout_s: float = 5.0) -> dict[str, Any]:
    """Take a replica out of service: HAProxy maintenance, drain, then stop it through supervisord.

    Args:
        lab: the lab.
        name: replica name.
        drain_timeout_s: seconds to wait for its in-flight requests (HAProxy ``scur``) to end
            before stopping it anyway.

    Returns:
        ``{"replica", "maint_at", "drained" (bool), "stopped_at", "pid"}`` (unix s; pid of the
        stopped process, None when it was not running).

    Raises:
        LabError: unknown replica, or supervisord/HAProxy not answering.
    """
    lab.replica(name)
    try:
        haproxy_command(lab, f"set server {BACKEND}/{name} state maint")
    except OSError as exc:
        raise LabError(f"haproxy stats socket not answering: {exc}") from exc
    maint_at = time.time()
    deadline = time.monotonic() + drain_timeout_s
    drained = False
    while True:
        try:
            scur = int(backend_rows(lab).get(name, {}).get("scur") or 0)
        except (OSError, ValueError):
            scur = 0
        if scur == 0:
            drained = True
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    pid = process_infos(lab).get(name, {}).get("pid") or None
    try:
        rpc(lab.state_dir, 10.0).supervisor.stopProcess(name, True)
    except xmlrpc.client.Fault as exc:
        if "NOT_RUNNING" not in exc.faultString:
            raise LabError(f"supervisord could not stop {name}: {exc.faultString}") from exc
        pid = None
    except (OSError, http.client.HTTPException) as exc:
        raise LabError(f"supervisord not answering while stopping {name}: {exc}") from exc
    return {
        "replica": name,
        "maint_at": maint_at,
        "drained": drained,
        "stopped_at": time.time(),
        "pid": pid,
    }


def back_in_standby(lab: Lab, name: str, infos: dict[str, Any], rows: dict[str, Any]) -> bool:
    """True when ``name`` is stopped (per ``infos``) and in maintenance (per ``rows``)."""
    return infos.get(name, {}).get("statename") != "RUNNING" and in_maintenance(rows.get(name))
