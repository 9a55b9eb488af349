"""Synthetic attempt records for the verdict's pure tests (unix seconds): one shape shared by
``test_verdict.py``, ``test_verdict_rows.py`` and ``test_confirm.py``."""

from __future__ import annotations

from typing import Any

#: the synthetic runs' start (unix s)
T0 = 1_800_000_000.0

#: network-jitter's ground truth of a 400 +/- 300 ms shim on r0 from T0 + 10 to T0 + 20; the
#: shim's stats file (its applied delay on r0's connections) confirms the fault
JITTER_GROUND = {
    "fault_at": T0 + 10,
    "cleared_at": T0 + 20,
    "mechanism": "shim",
    "replica": "r0",
    "generations_on_replica_in_window": 30,
    "delay_ms": 400,
    "jitter_ms": 300,
    "shim": {"connections": 12, "applied_delay": {"n": 300, "mean_s": 0.41}},
}

#: oom-kill's ground truth: r0 OOM-killed at T0 + 10, serving again at T0 + 12
OOM_GROUND = {
    "fault_at": T0 + 10,
    "replica": "r0",
    "oom_kills": 1,
    "death_cause": "oom",
    "replica_serving_again_at": T0 + 12,
}


def rec(
    sent: float,
    ok: bool = True,
    e2e: float = 0.3,
    replica: str | None = "r1",
    error_class: str | None = None,
    rid: str | None = None,
    attempt: int = 1,
) -> dict[str, Any]:
    """One final attempt sent at ``sent`` and ended ``e2e`` s later, answered by ``replica``
    (None: no X-Replica-Id); a failure's class is ``error_class`` (default ``http_5xx``, the
    only one with a status: 503)."""
    cls = None if ok else (error_class or "http_5xx")
    return {
        "request_id": rid or f"q{sent:.3f}",
        "attempt": attempt,
        "final": True,
        "intended_at": sent,
        "sent_at": sent,
        "end_at": sent + e2e,
        "first_token_at": sent + 0.01 if ok else None,
        "first_byte_at": sent + 0.005 if ok else None,
        "chunk_times": [sent + 0.01, sent + e2e] if ok else [],
        "ok": ok,
        "error_class": cls,
        "status": 200 if ok else (503 if cls == "http_5xx" else None),
        "replica": replica,
    }


def steady(
    a: float,
    b: float,
    rate: float = 10.0,
    replicas: tuple[str | None, ...] = ("r0", "r1", "r2"),
    **kw: Any,
) -> list[dict[str, Any]]:
    """Requests from ``a`` to ``b`` at ``rate`` per second, spread over ``replicas`` in turn;
    ``kw`` goes to :func:`rec`."""
    n = int((b - a) * rate)
    return [rec(a + i / rate, replica=replicas[i % len(replicas)], **kw) for i in range(n)]
