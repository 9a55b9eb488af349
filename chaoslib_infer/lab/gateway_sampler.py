"""Background sampling of the gateway (HAProxy ``show stat``) and the engines' queues during a
fault.

Shared by the upstream-timeout drill (:mod:`chaoslib_infer.drills.upstream_timeout.actions`) and the
simultaneous-restarts drill (:mod:`chaoslib_infer.drills.simultaneous_restarts.actions`).
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

from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.lab.fleet import HAPROXY_SOCK, Lab

__all__ = [
    "GatewaySampler",
    "serving_replicas",
]
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


def serving_replicas(lab: Lab) -> list[str]:
    """Replicas that take traffic (standby replicas of an autoscaling lab left out)."""
    return [str(r["name"]) for r in lab.meta["replicas"] if not r.get("standby")]
