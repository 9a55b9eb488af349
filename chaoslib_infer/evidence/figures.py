"""Compute a drill's figures (client view) and ground truth (lab view) after the run.

Client figures come from the per-attempt records; ground truth from the lab's own event log
(cgroup OOM counters, supervisor events, the engine's generation ledger). Both land in
``summary.json`` side by side so a reviewer can check one against the other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaoslib_infer.load.records import read_records
from chaoslib_infer.measure import figures as mfig
from chaoslib_infer.measure.metrics import window_stats

__all__ = ["read_jsonl", "drill_figures"]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL file, skipping unparsable lines (a writer killed mid-line). Missing file: []."""
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


def drill_figures(
    run_dir: Path,
    lab_events: list[dict[str, Any]],
    ledger: list[dict[str, Any]],
    served_after: Any = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(figures, ground_truth)`` for one drill run.

    Args:
        run_dir: the drill's run folder (``records.jsonl``, ``faults.jsonl``).
        lab_events: the lab's ground-truth events (``events.jsonl``), unix-second timestamps.
        ledger: the engine's generation ledger entries (``{"t", "replica", "request_id", ...}``).
        served_after: optional callable ``(replica, after) -> float | None`` giving the unix time of
            the first request a replica served after ``after`` (lab ground truth).

    Returns:
        ``figures``: the ``summary.json`` figure keys (requests, availability, error_rate,
        timeout_rate, p50/p95/p99 E2E and P99 TTFT in seconds, interruption_s, failed_requests,
        restart_s, warmup_ttft_s, steady_ttft_p50_s, duplicates) plus extras;
        ``ground_truth``: fault_at, oom_kills, replica_died_at, replica_serving_again_at (unix s).
    """
    records = read_records(run_dir / "records.jsonl") if (run_dir / "records.jsonl").exists() else []
    faults = read_jsonl(run_dir / "faults.jsonl")
    whole = window_stats(records)
    figures: dict[str, Any] = {
        "requests": int(whole.get("requests") or 0),
        "availability": _num(whole.get("availability")),
        "error_rate": _num(whole.get("error_rate")),
        "timeout_rate": _num(whole.get("timeout_rate")),
        "p50_e2e_s": _num(whole.get("p50_e2e_s")),
        "p95_e2e_s": _num(whole.get("p95_e2e_s")),
        "p99_e2e_s": _num(whole.get("p99_e2e_s")),
        "p999_e2e_s": _num(whole.get("p999_e2e_s")),
        "p50_ttft_s": _num(whole.get("p50_ttft_s")),
        "p99_ttft_s": _num(whole.get("p99_ttft_s")),
        "censored_fraction": _num(whole.get("censored_fraction")),
        "errors_by_class": whole.get("errors_by_class") or {},
        "duplicates": int(mfig.duplicates(records, ledger)),
    }
    ground: dict[str, Any] = {}
    fault = next((f for f in reversed(faults) if f.get("kind") == "oom-kill"), None)
    if fault is None:
        return figures, ground
    fault_at = float(fault["fault_at"])
    replica = str(fault["replica"])
    ground["fault_at"] = fault_at
    ground["replica"] = replica
    ground["oom_kills"] = int(fault.get("oom_kills_after", 0)) - int(fault.get("oom_kills_before", 0))
    died = next(
        (
            e
            for e in lab_events
            if e.get("event") == "exit" and e.get("replica") == replica and float(e["t"]) >= fault_at - 1.0
        ),
        None,
    )
    died_at = float(died["t"]) if died else fault_at
    ground["replica_died_at"] = died_at
    ground["death_cause"] = died.get("cause") if died else None
    ready = next(
        (
            e
            for e in lab_events
            if e.get("event") == "ready" and e.get("replica") == replica and float(e["t"]) > died_at
        ),
        None,
    )
    ground["replica_ready_at"] = float(ready["t"]) if ready else None
    serving_again = served_after(replica, died_at) if served_after else None
    ground["replica_serving_again_at"] = serving_again

    before = [r for r in records if float(r.get("sent_at") or 0.0) < fault_at]
    intr = mfig.interruption(records, fault_at)
    figures["interruption_s"] = float(intr.get("interruption_s") or 0.0)
    figures["failed_requests"] = int(intr.get("failed_requests") or 0)
    figures["first_failure_at"] = intr.get("first_failure_at")
    figures["last_failure_at"] = intr.get("last_failure_at")
    restart = mfig.restart_from_records(records, replica, died_at)
    figures["restart_s"] = _num(restart)
    figures["restart_s_ground_truth"] = (serving_again - died_at) if serving_again else None
    warm = mfig.warmup(records, replica, died_at, k=3)
    figures["warmup_ttft_s"] = _num(warm.get("mean_ttft_s") if isinstance(warm, dict) else warm)
    figures["warmup"] = warm
    figures["steady_ttft_p50_s"] = _num(mfig.steady_ttft_p50(before, None, None))
    return figures, ground
