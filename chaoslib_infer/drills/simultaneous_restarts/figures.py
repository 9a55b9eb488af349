"""Figures of the ``simultaneous-restarts`` fault: who carried the traffic while K replicas restarted?

Definitions (all times unix s; the *restart window* is ``[fault_at, all_serving_at)``, from the
restart instant to the moment the last restarted replica served a request again, lab ground truth):

- ``all_serving_s``: ``all_serving_at - fault_at`` (ground truth: ``Lab.served`` after each
  replica's ``exit`` event). ``all_serving_s_client``: the same seen by clients (the send time of
  the first successful attempt each restarted replica answered after its death, latest of them).
- ``survivor_share_ratio``: attempts *sent* in the restart window whose ``replica`` is a survivor,
  over every attempt sent in it (failed ones included); None without survivor or without attempts.
  ``window_requests``, ``survivor_requests`` are the two counts.
- ``window_error_rate`` / ``window_failed``: error rate and failed attempts among those sent in the
  restart window (``measure.metrics.window_stats``).
- ``survivor_waiting_max`` / ``survivor_running_max`` (engines' ``vllm:num_requests_waiting`` /
  ``running``), ``survivor_scur_max`` (HAProxy sessions on a survivor), ``queue_max`` (requests
  queued in HAProxy): maxima of the samples taken in the restart window.
- ``warmup``: per restarted replica, :func:`chaoslib_infer.measure.figures.warmup` of its first 3
  requests sent after its ``ready`` event; ``warmup_ttft_s`` the largest of their mean TTFTs.
- ``interruption_s`` / ``failed_requests``: :func:`chaoslib_infer.measure.figures.interruption`.

Ground truth: ``restarts`` ({replica: ``died_at``, ``cause``, ``started_at``, ``new_pid``,
``ready_at``, ``serving_again_at``, ``restart_s``}) from ``events.jsonl`` and ``Lab.served``,
``all_serving_at``, ``fault_at``, ``replicas``, ``survivors``.
"""

from __future__ import annotations

from typing import Any

from chaoslib_infer.drills.interruption import interruption_figures
from chaoslib_infer.lab.restarts import KIND, ground_truth
from chaoslib_infer.measure import figures as mfig
from chaoslib_infer.measure.figkit import MILESTONE, RECOVERY, DrillContext, Marker, mark, num
from chaoslib_infer.measure.metrics import window_stats

__all__ = ["LEDGER_LABELS", "compute", "markers", "survivor_share"]

LEDGER_LABELS = ("restarts injected", "restart fault cleared")


def markers(ground: dict[str, Any], figures: dict[str, Any]) -> list[Marker]:
    """Timeline markers: each restarted replica's death, ready and first request served again;
    all of them serving again."""
    out: list[Marker] = []
    for r, row in (ground.get("restarts") or {}).items():
        out += mark(row.get("died_at"), f"{r} died", MILESTONE)
        out += mark(row.get("ready_at"), f"{r} ready", RECOVERY)
        out += mark(row.get("serving_again_at"), f"{r} serving again", RECOVERY)
    out += mark(ground.get("all_serving_at"), "all serving", RECOVERY)
    return out


def survivor_share(
    records: list[dict[str, Any]], survivors: list[str], start: float, end: float
) -> tuple[int, int, float | None]:
    """``(attempts sent in [start, end), of them answered by a survivor, share)``."""
    sent = [r for r in records if r.get("sent_at") is not None and start <= r["sent_at"] < end]
    mine = sum(1 for r in sent if r.get("replica") in survivors)
    share = mine / len(sent) if sent and survivors else None
    return len(sent), mine, share


def compute(ctx: DrillContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(figures, ground_truth)`` for the last ``simultaneous-restarts`` fault of the run.

    See the module docstring for every name; figures are None where the data is missing.
    """
    fault = ctx.last_fault(KIND)
    if fault is None:
        return {}, {}
    fault_at = float(fault["fault_at"])
    targets = [str(r) for r in fault.get("replicas") or []]
    survivors = [str(r) for r in fault.get("survivors") or []]
    killed = {str(k): int(v) for k, v in (fault.get("killed_pids") or {}).items()}
    restarts: dict[str, dict[str, Any]] = {}
    for name in targets:
        row = ground_truth(ctx.lab_events, name, killed.get(name, 0), fault_at)
        served = None
        if row["died_at"] is not None and ctx.served_after is not None:
            served = ctx.served_after(name, float(row["died_at"]))
        row["serving_again_at"] = served
        row["restart_s"] = (served - row["died_at"]) if served is not None else None
        restarts[name] = row
    serving = [r["serving_again_at"] for r in restarts.values()]
    all_serving_at = max(serving) if serving and None not in serving else None
    ground: dict[str, Any] = {
        "fault_at": fault_at,
        "replicas": targets,
        "survivors": survivors,
        "method": fault.get("method"),
        "restarts": restarts,
        "all_serving_at": all_serving_at,
    }
    figures: dict[str, Any] = {}
    figures["all_serving_s"] = (all_serving_at - fault_at) if all_serving_at else None
    client: list[float | None] = []
    for name, row in restarts.items():
        died = row["died_at"] if row["died_at"] is not None else fault_at
        back = mfig.restart_from_records(ctx.records, name, died)
        client.append(None if back is None else died + back)
    figures["all_serving_s_client"] = (
        max(c for c in client if c is not None) - fault_at
        if client and None not in client
        else None
    )
    end = all_serving_at if all_serving_at is not None else fault.get("all_serving_at")
    if end is not None:
        n, mine, share = survivor_share(ctx.records, survivors, fault_at, float(end))
        stats = window_stats(ctx.records, start=fault_at, end=float(end))
        figures["window_requests"] = n
        figures["survivor_requests"] = mine
        figures["survivor_share_ratio"] = share
        figures["window_error_rate"] = num(stats.get("error_rate"))
        figures["window_failed"] = int(stats.get("failed") or 0)
    else:
        figures.update(
            window_requests=None,
            survivor_requests=None,
            survivor_share_ratio=None,
            window_error_rate=None,
            window_failed=None,
        )
    for key in ("survivor_waiting_max", "survivor_running_max", "survivor_scur_max", "queue_max"):
        figures[key] = fault.get(key)
    steady = num(mfig.steady_ttft_p50(ctx.records_before(fault_at), None, None))
    warm: dict[str, Any] = {}
    for name, row in restarts.items():
        if row["ready_at"] is not None:
            warm[name] = mfig.warmup(ctx.records, name, float(row["ready_at"]), 3, steady)
    means = [w["mean_ttft_s"] for w in warm.values() if w.get("mean_ttft_s") is not None]
    figures["warmup"] = warm
    figures["warmup_ttft_s"] = max(means) if means else None
    figures["steady_ttft_p50_s"] = steady
    intr = mfig.interruption(ctx.records, fault_at)
    figures.update(interruption_figures(intr))
    return figures, ground
