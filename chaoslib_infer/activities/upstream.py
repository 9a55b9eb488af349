"""Drill 3, upstream timeout: one replica stops answering while keeping its socket open.

Does the gateway fail fast, or let requests hang until the client gives up (and how many)? The
action freezes one replica (:mod:`chaoslib_infer.lab.freeze`), holds the fault while a background
thread samples HAProxy's ``show stat`` every ~50 ms (server status: ground truth of the ejection;
``qcur``/``scur``: queue growth) and the engines' ``vllm:num_requests_waiting`` where reachable,
then leaves the replica frozen for the steady-state hypothesis; the rollback thaws it.

Also home of :class:`GatewaySampler`, shared with the simultaneous-restarts drill.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer import settings
from chaoslib_infer.activities.lab import _lab, _log_fault, _pick_replica
from chaoslib_infer.lab import freeze as lab_freeze
from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.lab.fleet import FAULTS_FILE, HAPROXY_SOCK, Lab, LabError

__all__ = ["freeze_replica", "thaw_replicas"]

KIND = lab_freeze.KIND
_METRIC = re.compile(r"^(vllm:num_requests_(?:waiting|running))(?:\{[^}]*\})?\s+(\S+)$", re.M)


class GatewaySampler:
    """Background sampling of the gateway (HAProxy ``show stat``) and the engines' queues.

    Two daemon threads: one reads ``show stat`` every ``interval_s`` (server ``status``,
    ``qcur``, ``scur`` and the backend's), one reads each replica's ``/metrics``
    (``vllm:num_requests_waiting``/``running``) every ``engine_interval_s``; an engine that does
    not answer within ``engine_timeout_s`` (frozen, restarting) is sampled as ``None``.

    Args:
        lab: the running lab.
        interval_s: seconds between ``show stat`` samples.
        engine_interval_s: seconds between rounds of engine metrics.
        engine_timeout_s: per-request timeout of an engine metrics read, seconds.
    """

    def __init__(
        self,
        lab: Lab,
        interval_s: float = 0.05,
        engine_interval_s: float = 0.2,
        engine_timeout_s: float = 0.15,
    ) -> None:
        """Prepare (not start) the sampler; see the class docstring."""
        self.lab = lab
        self.interval_s = float(interval_s)
        self.engine_interval_s = float(engine_interval_s)
        self.engine_timeout_s = float(engine_timeout_s)
        self.stats: list[dict[str, Any]] = []
        self.engines: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._ports = {r["name"]: int(r["port"]) for r in lab.meta["replicas"]}
        # where each replica listens: its node's address on a lab with nodes, else loopback
        self._hosts = {r["name"]: lab.replica_host(r["name"]) for r in lab.meta["replicas"]}

    # -- sampling ------------------------------------------------------------------------------
    def _show_stat(self) -> dict[str, Any] | None:
        try:
            text = hap.stats_command(self.lab.state_dir / HAPROXY_SOCK, "show stat", 1.0)
        except OSError:
            return None
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if not lines or not lines[0].startswith("# "):
            return None
        header = lines[0][2:].split(",")
        servers: dict[str, dict[str, Any]] = {}
        backend: dict[str, Any] = {}
        for ln in lines[1:]:
            row = dict(zip(header, ln.split(","), strict=False))
            if row.get("pxname") != "engines":
                continue
            entry = {
                "status": row.get("status", ""),
                "qcur": int(row.get("qcur") or 0),
                "scur": int(row.get("scur") or 0),
            }
            if row.get("svname") == "BACKEND":
                backend = entry
            elif row.get("svname") != "FRONTEND":
                servers[str(row.get("svname"))] = entry
        return {"servers": servers, "backend": backend}

    def _stat_loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            snap = self._show_stat()
            if snap is not None:
                self.stats.append({"t": time.time(), **snap})
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def _engine_metrics(self, port: int, host: str = "127.0.0.1") -> dict[str, float] | None:
        conn = http.client.HTTPConnection(host, port, timeout=self.engine_timeout_s)
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            if resp.status != 200:
                return None
            body = resp.read(1 << 20).decode(errors="replace")
        except (OSError, http.client.HTTPException):
            return None
        finally:
            conn.close()
        out: dict[str, float] = {}
        for name, value in _METRIC.findall(body):
            with contextlib.suppress(ValueError):
                out[name.rsplit("_", 1)[-1]] = float(value)
        return out or None

    def _engine_loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            for name, port in self._ports.items():
                t = time.time()
                m = self._engine_metrics(port, self._hosts.get(name, "127.0.0.1"))
                self.engines.append(
                    {
                        "t": t,
                        "replica": name,
                        "waiting": m.get("waiting") if m else None,
                        "running": m.get("running") if m else None,
                    }
                )
            self._stop.wait(max(0.0, self.engine_interval_s - (time.monotonic() - t0)))

    def start(self) -> GatewaySampler:
        """Start both sampling threads; returns self."""
        for target in (self._stat_loop, self._engine_loop):
            th = threading.Thread(target=target, daemon=True, name=f"sampler-{target.__name__}")
            th.start()
            self._threads.append(th)
        return self

    def stop(self) -> None:
        """Stop sampling (waits up to 2 s for the threads)."""
        self._stop.set()
        for th in self._threads:
            th.join(timeout=2.0)

    # -- results -------------------------------------------------------------------------------
    def ejected_at(self, server: str, after: float) -> float | None:
        """Unix time of the first sample at or after ``after`` in which HAProxy no longer had
        ``server`` UP (``DOWN``, ``DOWN 1/2``, ``MAINT``...), None if it never left UP."""
        for s in self.stats:
            if s["t"] < after:
                continue
            status = s["servers"].get(server, {}).get("status", "")
            if status and not status.startswith("UP"):
                return float(s["t"])
        return None

    def back_up_at(self, server: str, after: float) -> float | None:
        """Unix time of the first sample at or after ``after`` with ``server`` UP again."""
        for s in self.stats:
            if s["t"] >= after and s["servers"].get(server, {}).get("status", "") == "UP":
                return float(s["t"])
        return None

    def queue_figures(
        self, start: float, end: float, watched: list[str], survivors: list[str]
    ) -> dict[str, Any]:
        """Queue growth between ``start`` and ``end`` (unix s).

        Returns:
            ``queue_max`` (max requests queued in HAProxy: backend ``qcur`` + servers' ``qcur``),
            ``watched_scur_max`` (max sessions open on the ``watched`` servers at once),
            ``survivor_scur_max`` (max sessions on any survivor), ``survivor_waiting_max`` /
            ``survivor_running_max`` (engine gauges, max over survivors; None if unreachable),
            ``stat_samples`` and ``engine_samples`` (counts in the interval).
        """
        stats = [s for s in self.stats if start <= s["t"] <= end]
        engines = [e for e in self.engines if start <= e["t"] <= end]

        def _max(values: list[float]) -> float | None:
            return max(values) if values else None

        return {
            "queue_max": _max(
                [
                    s["backend"].get("qcur", 0) + sum(v["qcur"] for v in s["servers"].values())
                    for s in stats
                ]
            ),
            "watched_scur_max": _max(
                [sum(s["servers"].get(w, {}).get("scur", 0) for w in watched) for s in stats]
            ),
            "survivor_scur_max": _max(
                [s["servers"].get(v, {}).get("scur", 0) for s in stats for v in survivors]
            ),
            "survivor_waiting_max": _max(
                [
                    float(e["waiting"])
                    for e in engines
                    if e["replica"] in survivors and e["waiting"] is not None
                ]
            ),
            "survivor_running_max": _max(
                [
                    float(e["running"])
                    for e in engines
                    if e["replica"] in survivors and e["running"] is not None
                ]
            ),
            "stat_samples": len(stats),
            "engine_samples": len(engines),
        }

    def write(self, path: Path) -> None:
        """Write every sample as JSON lines (``{"source": "haproxy"|"engine", ...}``)."""
        with path.open("w", encoding="utf-8") as fh:
            for s in self.stats:
                fh.write(json.dumps({"source": "haproxy", **s}, separators=(",", ":")) + "\n")
            for e in self.engines:
                fh.write(json.dumps({"source": "engine", **e}, separators=(",", ":")) + "\n")


def freeze_replica(
    replica: str = "auto",
    mode: str = "freeze",
    hold_s: float = 14.0,
    ttl_s: float = 120.0,
    sample_interval_s: float = 0.05,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Freeze one replica (socket left open) and hold the fault while sampling the gateway.

    The replica stays frozen after this action returns (the steady-state hypothesis then checks
    the service with one upstream hung); the rollback (:func:`thaw_replicas` /
    ``clear_lab_faults``) thaws it, and a dead-man timer thaws it after ``ttl_s`` whatever happens.

    Args:
        replica: replica name or ``"auto"`` (the first replica).
        mode: ``"freeze"`` (cgroup freezer, SIGSTOP fallback), ``"sigstop"``, or ``"blackhole"``
            (iptables DROP in the replica's network namespace; needs lab nodes).
        hold_s: seconds to hold the fault before returning (long enough for every request hung
            on the replica to reach the client's timeout).
        ttl_s: dead-man delay, seconds after injection.
        sample_interval_s: ``show stat`` sampling period, seconds.
        configuration: Chaos Toolkit configuration (``infer_lab_dir``, ``infer_run_dir``).

    Returns:
        ``{"replica", "mode", "freezer", "fault_at" (unix s), "ejected_at" (unix s, HAProxy no
        longer has the replica UP; None if never), "ejection_s", "queue_max", "watched_scur_max"
        (requests hung on the replica at once), "survivor_waiting_max", "samples" (file)}``.

    Raises:
        ActivityFailed: no lab, unknown replica, ``blackhole`` without nodes, or the freeze failed.
    """
    if mode not in lab_freeze.MODES:
        raise ActivityFailed(f"mode must be one of {', '.join(lab_freeze.MODES)}, got {mode!r}")
    lab = _lab(configuration)
    name = _pick_replica(lab, replica)
    survivors = [n for n in _serving_replicas(lab) if n != name]
    sampler = GatewaySampler(lab, interval_s=float(sample_interval_s)).start()
    try:
        time.sleep(0.3)  # a few samples of the steady state
        try:
            rec = lab_freeze.freeze_replica(lab, name, mode=mode, ttl_s=float(ttl_s))
        except LabError as exc:
            raise ActivityFailed(str(exc)) from exc
        fault_at = float(rec["fault_at"])
        base = {
            "kind": KIND,
            "replica": name,
            "survivors": survivors,
            "mode": rec["mode"],
            "requested_mode": mode,
            "freezer": rec.get("freezer"),
            "cgroup": rec.get("cgroup"),
            "pids": rec.get("pids"),
            "fallback_reason": rec.get("fallback_reason"),
            "fault_id": rec.get("id"),
            "deadman_pid": rec.get("deadman_pid"),
            "fault_at": fault_at,
            "hold_s": float(hold_s),
            "lab_dir": str(lab.state_dir),
        }
        _log_fault(configuration, {**base, "phase": "injected"})
        end = fault_at + float(hold_s)
        while time.time() < end:
            time.sleep(min(0.05, max(0.0, end - time.time())))
    finally:
        sampler.stop()
    samples = settings.run_dir(configuration) / "upstream-timeout-samples.jsonl"
    sampler.write(samples)
    held_until = time.time()
    ejected = sampler.ejected_at(name, fault_at)
    result = {
        **base,
        "phase": "held",
        "held_until": held_until,
        "ejected_at": ejected,
        "ejection_s": (ejected - fault_at) if ejected is not None else None,
        **sampler.queue_figures(fault_at, held_until, [name], survivors),
        "samples": str(samples),
    }
    _log_fault(configuration, result)
    return result


def _serving_replicas(lab: Lab) -> list[str]:
    """Replicas that take traffic (standby replicas of an autoscaling lab left out)."""
    return [str(r["name"]) for r in lab.meta["replicas"] if not r.get("standby")]


def thaw_replicas(configuration: dict[str, Any] | None = None) -> list[str]:
    """Rollback: thaw every replica frozen by an upstream-timeout fault (idempotent).

    Returns:
        What was thawed (empty when nothing was frozen).
    """
    try:
        lab = Lab.attach(settings.lab_dir(configuration))
    except LabError:
        return []
    notes: list[str] = []
    for f in _recorded(lab):
        if f.get("kind") == KIND and f.get("id"):
            note = lab.remove_fault(str(f["id"]))
            if note:
                notes.append(note)
    return notes


def _recorded(lab: Lab) -> list[dict[str, Any]]:
    """Every fault record in the lab's ledger (active or not), so rollbacks also forget them."""
    try:
        data = json.loads((lab.state_dir / FAULTS_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [f for f in data if isinstance(f, dict)]
