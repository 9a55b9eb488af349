"""Figures of the ``network-jitter`` fault: retries, duplicate generations, tail latency under jitter.

Definitions: ``docs/definitions.md`` ("Drill figures", "Metrics"). Client figures
come from the attempt records (every attempt is a record with the logical ``request_id`` and its
``attempt`` number); duplicates are the client's logical requests that the engine's generation
ledger shows generated more than once. Ground truth comes from the lab only: the fault window from
the lab's ``events.jsonl`` (``network-jitter`` applied/removed, written when HAProxy was re-pointed
or the qdisc added/deleted), the generation ledger, and the shim's own stats file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from chaoslib_infer.drills.interruption import interruption_figures
from chaoslib_infer.measure.figkit import FAULT, REMOVED, DrillContext, Marker, mark, num
from chaoslib_infer.measure.figures import interruption
from chaoslib_infer.measure.metrics import (
    logical_outcomes,
    logical_stats,
    retry_stats,
    window_stats,
)
from chaoslib_infer.measure.retrycost import generation_counts, wasted_tokens

#: ``generation_counts`` and ``wasted_tokens`` live in :mod:`chaoslib_infer.measure.retrycost`
#: (every drill judges what retries cost); re-exported here, where they were first defined.
__all__ = [
    "LEDGER_LABELS",
    "compute",
    "fault_window",
    "generation_counts",
    "interruption_seen",
    "markers",
    "wasted_tokens",
]

LEDGER_LABELS = ("jitter fault recorded", "jitter fault record cleared")

KIND = "network-jitter"
#: Ledger entries this long before the first send / after the last end still belong to the run (s).
LEDGER_MARGIN_S = 5.0


def interruption_seen(records: Sequence[Mapping[str, Any]], fault_at: float) -> dict[str, Any]:
    """The interruption figures of the jitter as its users saw it: every episode out of SLO
    (:func:`chaoslib_infer.measure.figures.interruption`) over the logical requests' final
    outcomes (:func:`chaoslib_infer.measure.metrics.logical_outcomes`), so an attempt the
    client's timeout gave up on and a retry then answered is no failure; what the retries cost
    is judged by the retry-cost rows.

    Returns:
        :func:`chaoslib_infer.drills.interruption.interruption_figures`' keys.
    """
    return interruption_figures(interruption(logical_outcomes(records), fault_at))


def fault_window(ctx: DrillContext) -> dict[str, Any] | None:
    """The last injected ``network-jitter`` fault of the run and its window (unix seconds).

    ``start`` is the lab's ``applied`` event (falling back to the fault log's ``fault_at``); ``end``
    the first ``removed`` event of the same fault after it (the undo, or the shim's own dead-man
    restore), falling back to the fault log's ``cleared_at``; None while still active.

    Returns:
        ``{"fault": <fault-log entry>, "start", "end", "removed_by"}`` or None without injection.
    """
    injected = [
        f for f in ctx.faults if f.get("kind") == KIND and f.get("phase", "injected") == "injected"
    ]
    if not injected:
        return None
    fault = injected[-1]
    token = fault.get("token")
    events = [
        e for e in ctx.lab_events if e.get("event") == KIND and token and e.get("token") == token
    ]
    # the shim's own restore event carries the token as its label
    events += [
        e
        for e in ctx.lab_events
        if e.get("event") == KIND and token and e.get("label") == token and e not in events
    ]
    applied = [float(e["t"]) for e in events if e.get("phase") == "applied"]
    start = min(applied) if applied else float(fault["fault_at"])
    removed = sorted(
        (float(e["t"]), str(e.get("by") or "")) for e in events if e.get("phase") == "removed"
    )
    removed = [r for r in removed if r[0] >= start]
    end: float | None = removed[0][0] if removed else None
    by: str | None = removed[0][1] if removed else None
    if end is None:
        cleared = [
            f
            for f in ctx.faults
            if f.get("kind") == KIND
            and f.get("phase") == "cleared"
            and f.get("fault_id") == fault.get("fault_id")
        ]
        if cleared:
            end, by = float(cleared[-1]["cleared_at"]), "remove (no lab event)"
    return {"fault": fault, "start": start, "end": end, "removed_by": by}


def _shim_stats(path: Any) -> dict[str, Any] | None:
    if not path:
        return None
    try:
        data = json.loads(Path(str(path)).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def markers(ground: dict[str, Any], figures: dict[str, Any]) -> list[Marker]:
    """Timeline markers: jitter applied on the replica's link and removed (and by whom)."""
    r = ground.get("replica")
    return [
        *mark(ground.get("fault_at"), f"jitter on {r}", FAULT),
        *mark(ground.get("cleared_at"), f"jitter off ({ground.get('removed_by')})", REMOVED),
    ]


def compute(ctx: DrillContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(figures, ground_truth)`` for the last ``network-jitter`` fault of the run.

    Figures (client view; "during jitter" = attempts, or logical requests by their first attempt,
    sent in ``[start, end)`` of the fault window):

    - ``mechanism``: ``"shim"`` or ``"netem"``.
    - ``retries``: attempt records with ``attempt > 1`` (whole run); ``retried_requests``: logical
      requests with more than one attempt.
    - ``duplicate_generations_during_jitter``: logical requests of this run generated more
      than once by the engine whose first attempt was sent in the window. The drill's
      ``duplicate_generations``, ``extra_generations``, ``wasted_tokens`` and
      ``wasted_completion_tokens`` are the common figures, computed once for every drill
      (:func:`chaoslib_infer.measure.rerun.rerun_figures`), not here.
    - ``p99_e2e_during_jitter_s``, ``p99_ttft_during_jitter_s``: attempt percentiles (seconds,
      successful attempts; ``censored_fraction_during_jitter`` beside them);
      ``p99_request_e2e_during_jitter_s``: per logical request, first send to final end (retries
      included); ``availability_during_jitter`` (attempts) and
      ``request_availability_during_jitter`` (logical requests, final outcome);
      ``timeout_rate_during_jitter``; ``requests_during_jitter`` (logical requests).
    - ``jitter_s``: window length (s).
    - ``interruption_s`` and the episode figures (:func:`interruption_seen`): every episode out
      of SLO from the injection on, over the logical requests' final outcomes.

    Ground truth (lab only): ``mechanism``, ``replica``, ``fault_at``/``cleared_at`` (unix s),
    ``removed_by``, ``delay_ms``/``jitter_ms``/``loss_pct``, ``generations_in_window`` and
    ``generations_on_replica_in_window`` (ledger entries), ``duplicate_requests_in_ledger``
    (request ids with more than one generation in the run's span of the ledger, client records not
    used), ``generations_by_request`` (``{request_id: count}`` for request ids generated in the
    window more than once over the run), ``shim`` (its stats file: connections, chunks,
    resets, applied delay mean/stdev) or ``netem`` (``{"bytes", "packets"}`` through its qdiscs,
    read at removal): the delay applied that confirms the fault (``verdict/timeline.py``).
    """
    win = fault_window(ctx)
    if win is None:
        return {}, {}
    fault, start, end = win["fault"], float(win["start"]), win["end"]
    records = ctx.records
    span_end = max((float(r["end_at"]) for r in records if r.get("end_at")), default=start)
    w_end = float(end) if end is not None else span_end
    figures: dict[str, Any] = {"mechanism": fault.get("mechanism")}
    rs = retry_stats(records)
    figures["retries"] = sum(1 for r in records if int(r.get("attempt") or 1) > 1)
    figures["retried_requests"] = int(rs["retried_requests"])
    figures["succeeded_after_retry"] = int(rs["succeeded_after_retry"])
    ids = {str(r["request_id"]) for r in records if r.get("request_id")}
    first_sent: dict[str, float] = {}
    for r in records:
        rid, sent = r.get("request_id"), r.get("sent_at")
        if rid and isinstance(sent, int | float):
            first_sent[str(rid)] = min(first_sent.get(str(rid), float(sent)), float(sent))
    run_start = min(first_sent.values(), default=start) - LEDGER_MARGIN_S
    run_ledger = [
        e
        for e in ctx.ledger
        if isinstance(e.get("t"), int | float)
        and run_start <= float(e["t"]) <= span_end + LEDGER_MARGIN_S
    ]
    counts_run = generation_counts(run_ledger)
    mine = {rid: n for rid, n in counts_run.items() if rid in ids}
    figures["duplicate_generations_during_jitter"] = sum(
        1 for rid, n in mine.items() if n > 1 and start <= first_sent.get(rid, -1.0) < w_end
    )
    waste = wasted_tokens(run_ledger, mine)  # ground truth: duplicates without an end line
    during = window_stats(records, start, w_end)
    logical = logical_stats(records, start, w_end)
    figures["requests_during_jitter"] = int(logical.get("requests") or 0)
    figures["p99_e2e_during_jitter_s"] = num(during.get("p99_e2e_s"))
    figures["p99_ttft_during_jitter_s"] = num(during.get("p99_ttft_s"))
    figures["p99_request_e2e_during_jitter_s"] = num(logical.get("p99_e2e_s"))
    figures["censored_fraction_during_jitter"] = num(during.get("censored_fraction"))
    figures["availability_during_jitter"] = num(during.get("availability"))
    figures["request_availability_during_jitter"] = num(logical.get("availability"))
    figures["timeout_rate_during_jitter"] = num(during.get("timeout_rate"))
    figures["jitter_s"] = (w_end - start) if end is not None else None
    figures.update(interruption_seen(records, start))  # every episode, as the users saw them

    replica = str(fault.get("replica"))
    in_window = [
        e
        for e in run_ledger
        if start <= float(e["t"]) < w_end and e.get("event", "generation") == "generation"
    ]
    window_ids = {str(e.get("request_id")) for e in in_window}
    ground: dict[str, Any] = {
        "mechanism": fault.get("mechanism"),
        "replica": replica,
        "fault_id": fault.get("fault_id"),
        "fault_at": start,
        "cleared_at": end,
        "removed_by": win["removed_by"],
        "delay_ms": fault.get("delay_ms"),
        "jitter_ms": fault.get("jitter_ms"),
        "loss_pct": fault.get("loss_pct"),
        "distribution": fault.get("distribution"),
        "generations_in_window": len(in_window),
        "generations_on_replica_in_window": sum(
            1 for e in in_window if e.get("replica") == replica
        ),
        "duplicate_requests_in_ledger": sum(1 for n in counts_run.values() if n > 1),
        "duplicate_generations_without_end": waste["duplicate_generations_without_end"],
        "generations_by_request": {
            rid: counts_run[rid] for rid in sorted(window_ids) if counts_run.get(rid, 0) > 1
        },
    }
    cleared = [
        f
        for f in ctx.faults
        if f.get("kind") == KIND
        and f.get("phase") == "cleared"
        and f.get("fault_id") == fault.get("fault_id")
    ]
    if fault.get("mechanism") == "netem" and cleared and isinstance(cleared[-1].get("netem"), dict):
        ground["netem"] = cleared[-1]["netem"]  # the qdisc's counters before its removal
    stats = _shim_stats(fault.get("stats_path")) if fault.get("mechanism") == "shim" else None
    if stats is not None:
        ground["shim"] = {
            k: stats.get(k)
            for k in (
                "connections",
                "resets",
                "chunks_up",
                "chunks_down",
                "upstream_connect_failures",
                "applied_delay",
                "sampled_delay",
                "stop_reason",
            )
        }
    return figures, ground
