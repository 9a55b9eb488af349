"""Probes that compare what a replica's health endpoint says with what its completions do.

A real engine whose scheduler loop died keeps answering ``/health`` with 200 while every completion
hangs; a load balancer that trusts the health check keeps sending it traffic. These probes sample a
replica's health endpoint directly (its own loopback port, from the lab's ``lab.json``) and read the
background load's records for that replica; the figure is defined in
:mod:`chaoslib_infer.measure.health`.

Samples go to ``<infer_run_dir>/health_samples.jsonl`` (``{"t", "replica", "healthy", "status"}``)
and each check's result to ``<infer_run_dir>/health_checks.jsonl``, so the drill's figures can be
recomputed after the run.
"""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer import settings
from chaoslib_infer.evidence.figures import read_jsonl
from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.lab.activity import attach_lab, last_fault
from chaoslib_infer.lab.fleet import LEDGER_FILE, REQUEST_LOG, Lab
from chaoslib_infer.load.records import read_records
from chaoslib_infer.measure.health import health_disagreement, replica_of_requests

__all__ = ["health_disagreement_check"]

SAMPLE_PERIOD_S = 0.2
HEALTH_TIMEOUT_S = 0.5
SAMPLES_FILE = "health_samples.jsonl"
CHECKS_FILE = "health_checks.jsonl"
_MAX_DURATION_S = 120.0


def _health_status(
    port: int, path: str, timeout_s: float = HEALTH_TIMEOUT_S, host: str = "127.0.0.1"
) -> int | None:
    """HTTP status of ``GET path`` on ``host:port`` (None: no answer in time)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def _pick(lab: Lab, replica: str, configuration: dict[str, Any] | None) -> str:
    names = lab.replica_names()
    if not names:
        raise ActivityFailed("the lab has no replica")
    if replica in ("auto", "", None):
        fault = last_fault(configuration, "engine-fault")
        if fault and fault.get("replica") in names:
            return str(fault["replica"])
        return names[0]
    if replica not in names:
        raise ActivityFailed(f"unknown replica {replica!r}; the lab has {', '.join(names)}")
    return replica


def lab_replica_map(lab: Lab) -> dict[str, str]:
    """Request id -> replica from the lab's own logs (engine ledger, HAProxy request log).

    Needed for attempts that never got a response header (a hung engine sends none).
    """
    ledger = read_jsonl(lab.state_dir / LEDGER_FILE)
    routed = [(e.request_id, e.server) for e in hap.parse_request_log(lab.state_dir / REQUEST_LOG)]
    return replica_of_requests(ledger, routed)


def _append(path: Path, lines: list[dict[str, Any]]) -> None:
    with path.open("a", encoding="utf-8") as fh:
        for line in lines:
            fh.write(json.dumps(line) + "\n")


def health_disagreement_check(
    replica: str = "auto",
    duration_s: float = 5.0,
    window_s: float = 1.0,
    max_disagreement_s: float = 0.0,
    settle_s: float = 0.0,
    min_failed_ratio: float = 1.0,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Sample a replica's health endpoint and measure how long it said healthy while failing.

    Samples ``GET <health path>`` on the replica's own port every 0.2 s for ``duration_s`` seconds
    (no answer within 0.5 s counts as unhealthy), waits ``settle_s`` seconds for attempts still in
    flight to end, then reads the background load's records and computes
    :func:`chaoslib_infer.measure.health.health_disagreement` over the sampled span. Records
    without a replica (no response header) are attributed from the lab's engine ledger and
    HAProxy request log. Run it at least one client TTFT timeout after arming a ``hang``, or give
    ``settle_s``: a hung attempt only has a record once the client gave up.

    Args:
        replica: replica name, or ``"auto"`` (the replica of the last engine fault, else the first).
        duration_s: sampling time in seconds (at most 120).
        window_s: window length of the definition, seconds.
        max_disagreement_s: the check passes when the disagreement is at most this (seconds).
        settle_s: extra seconds to wait before reading the records (at most 60).
        min_failed_ratio: failed share of a window's attempts that makes it disagree (0..1].
        configuration: Chaos Toolkit configuration (``infer_lab_dir``, ``infer_run_dir``).

    Returns:
        ``{"replica", "disagreement_s" (s), "intervals" [{"replica", "start", "end",
        "duration_s", "attempts", "failed"}], "samples", "healthy_samples", "windows_judged",
        "window_s", "min_failed_ratio", "passed": bool, "started_at", "ended_at"}``; use the tolerance
        ``{"type": "jsonpath", "path": "$.passed", "expect": true}``.

    Raises:
        ActivityFailed: no lab or unknown replica; ``passed`` is False when no window had
            attempts to judge (no evidence is not agreement).
    """
    duration = min(max(float(duration_s), SAMPLE_PERIOD_S), _MAX_DURATION_S)
    lab = attach_lab(configuration)
    name = _pick(lab, replica, configuration)
    port = next(int(r["port"]) for r in lab.meta["replicas"] if r["name"] == name)
    host = lab.replica_host(name)
    path = str(lab.meta.get("health_path") or "/health")
    run_dir = settings.run_dir(configuration)
    samples: list[dict[str, Any]] = []
    started = time.time()
    t_next = time.monotonic()
    t_end = t_next + duration
    while True:  # bounded: one sample per period until t_end
        status = _health_status(port, path, host=host)
        samples.append(
            {"t": time.time(), "replica": name, "healthy": status == 200, "status": status}
        )
        t_next += SAMPLE_PERIOD_S
        if t_next > t_end:
            break
        delay = t_next - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    ended = time.time()
    _append(run_dir / SAMPLES_FILE, samples)
    if settle_s:
        time.sleep(min(max(float(settle_s), 0.0), 60.0))
    rpath = settings.records_path(configuration)
    records = read_records(rpath) if rpath.exists() else []
    result = health_disagreement(
        samples,
        records,
        window_s=float(window_s),
        replica_of=lab_replica_map(lab),
        min_failed_ratio=float(min_failed_ratio),
    )
    out = {
        "replica": name,
        "disagreement_s": round(float(result["disagreement_s"]), 3),
        "intervals": result["intervals"],
        "samples": len(samples),
        "healthy_samples": sum(1 for s in samples if s["healthy"]),
        "windows_judged": result["windows_judged"],
        "window_s": float(window_s),
        "min_failed_ratio": float(min_failed_ratio),
        "started_at": started,
        "ended_at": ended,
    }
    out["passed"] = bool(
        result["windows_judged"] > 0 and result["disagreement_s"] <= float(max_disagreement_s)
    )
    _append(run_dir / CHECKS_FILE, [out])
    return out
