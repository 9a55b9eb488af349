"""Figures of the ``engine-fault`` kind: sabotaged requests, how many the client caught, and how
long the health endpoint disagreed with the completions.

Ground truth: the engine's own ledger (one ``"event": "fault"`` line per sabotaged request, written
by the sim engine when it sabotages it, with the prompt's size) and the lab's exit, start and ready
events (``crash_on_long_prompt``: exits, exit codes, restarts, restart time, and the prompt sizes
the replica died on, :mod:`chaoslib_infer.measure.crashes`).
Client view: the load records' error classes, and the health samples/checks that
:func:`chaoslib_infer.activities.health.health_disagreement_check` wrote to the run folder.
Definitions: ``docs/definitions.md`` (failure classes, health disagreement) and
:mod:`chaoslib_infer.measure.health`.
"""

from __future__ import annotations

from typing import Any

from chaoslib_infer.measure.crashes import CRASH_MODES, crash_report
from chaoslib_infer.measure.figkit import (
    FAULT,
    MILESTONE,
    RECOVERY,
    REMOVED,
    DrillContext,
    Marker,
    mark,
    read_jsonl,
)
from chaoslib_infer.measure.health import health_disagreement, replica_of_requests

__all__ = ["EXPECTED_CLASSES", "compute", "markers"]

#: Error classes a client should record for a request sabotaged by each mode (empty: the mode
#: shows in latency, not in an error class).
EXPECTED_CLASSES: dict[str, frozenset[str]] = {
    # http_5xx: the 503 a hung request gets when the hang is cleared, or a proxy's 504
    "hang": frozenset({"timeout_ttft", "timeout_total", "http_5xx"}),
    "reset_after_k": frozenset({"reset"}),
    "stall": frozenset({"timeout_idle", "timeout_total"}),
    "error_in_stream": frozenset({"stream_error"}),
    "empty": frozenset({"empty"}),
    "garbled": frozenset({"garbled"}),
    "truncated": frozenset({"truncated"}),
    "slowdown": frozenset(),
    "crash_on_long_prompt": frozenset({"reset", "connect", "timeout_connect", "http_5xx"}),
    # a provider's error answer: caught when the request's attempt got it (a retry may succeed)
    "http_error": frozenset({"http_429", "http_4xx", "http_5xx"}),
}


def markers(ground: dict[str, Any], figures: dict[str, Any]) -> list[Marker]:
    """Timeline markers: engine fault armed and cleared, exits of the sabotaged replicas."""
    modes = ", ".join(ground.get("modes") or [])
    out = mark(ground.get("fault_at"), f"engine fault armed ({modes})", FAULT)
    out += mark(ground.get("cleared_at"), "engine fault cleared", REMOVED)
    for e in ground.get("replica_exits") or []:
        out += mark(e.get("t"), f"{e.get('replica')} exited ({e.get('cause')})", MILESTONE)
        out += mark(e.get("serving_again_at"), f"{e.get('replica')} serving again", RECOVERY)
    return out


def _trigger(sets: list[dict[str, Any]], figures: dict[str, Any]) -> str | None:
    """One line on what killed the replicas: the armed threshold and the prompts they died on."""
    if not figures.get("replica_exits"):
        return None
    armed = sorted(
        {int(f["params"]["n"]) for f in sets if isinstance((f.get("params") or {}).get("n"), int)}
    )
    sizes = figures.get("crash_prompt_tokens") or []
    died = (
        f"died on prompts of {', '.join(map(str, sizes))} tokens "
        f"({figures.get('crash_prompt_tokens_source')} count)"
        if sizes
        else "no request was in flight on the dying process (the trigger is not a request)"
    )
    limit = f"armed on prompts over {', '.join(map(str, armed))} tokens; " if armed else ""
    return limit + died


def _health_disagreement_s(ctx: DrillContext) -> float | None:
    """Recompute each logged health check over its own samples; None when no check ran."""
    checks = read_jsonl(ctx.run_dir / "health_checks.jsonl")
    if not checks:
        return None
    samples = read_jsonl(ctx.run_dir / "health_samples.jsonl")
    replica_of = replica_of_requests(ctx.ledger)
    total = 0.0
    for chk in checks:
        lo, hi = float(chk.get("started_at") or 0.0), float(chk.get("ended_at") or 0.0)
        mine = [
            s
            for s in samples
            if s.get("replica") == chk.get("replica") and lo <= float(s.get("t") or 0.0) <= hi
        ]
        res = health_disagreement(
            mine,
            ctx.records,
            window_s=float(chk.get("window_s") or 1.0),
            replica_of=replica_of,
            min_failed_ratio=float(chk.get("min_failed_ratio") or 1.0),
        )
        total += float(res["disagreement_s"])
    return total


def compute(ctx: DrillContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(figures, ground_truth)`` for the engine faults of the run.

    Figures: ``sabotaged_requests`` (this drill's requests the engine sabotaged, from its ledger),
    ``caught_requests`` (of those, requests whose record failed with the mode's expected class,
    :data:`EXPECTED_CLASSES`), ``missed_requests`` (sabotaged by a mode with an expected class but
    not caught), ``sabotaged_by_mode``/``caught_by_mode`` (counts), ``health_disagreement_s``
    (seconds, recomputed from the health checks' samples; None when no check ran).
    Crashes (:func:`chaoslib_infer.measure.crashes.crash_report`, exits of those replicas after
    the fault was armed; only when a crash mode was armed or a replica exited): ``replica_exits``, ``replica_restarts``, ``exit_codes``, ``restart_s``
    (worst death to serving again; None: unmeasured), ``restarts_unserved``,
    ``crash_prompt_tokens`` and their source (the trigger).
    Ground truth: ``fault_at`` (first fault armed, unix s), ``cleared_at``, ``replicas``, ``modes``,
    ``sabotaged_request_ids`` (count per replica), ``replica_exits`` (each exit of those replicas
    after the fault: ``{"replica", "t", "pid", "cause", "status", "restarted_at", "ready_at",
    "serving_again_at", "restart_s", "died_on"}``), ``crash_trigger`` (one line: the armed
    threshold and the prompt sizes the replicas died on; None without an exit; absent where no
    crash figures are).
    """
    sets = [
        f for f in ctx.faults if f.get("kind") == "engine-fault" and f.get("phase") != "cleared"
    ]
    clears = [
        f for f in ctx.faults if f.get("kind") == "engine-fault" and f.get("phase") == "cleared"
    ]
    ids = {r.get("request_id") for r in ctx.records}
    ids.discard(None)
    sabotaged: dict[str, str] = {}
    by_replica: dict[str, int] = {}
    for e in ctx.ledger:
        if e.get("event") != "fault" or e.get("request_id") not in ids:
            continue
        rid = str(e["request_id"])
        if rid not in sabotaged:
            by_replica[str(e.get("replica"))] = by_replica.get(str(e.get("replica")), 0) + 1
        sabotaged[rid] = str(e.get("mode"))
    classes: dict[str, set[str]] = {}
    for r in ctx.records:
        if not r.get("ok") and r.get("error_class"):
            classes.setdefault(str(r.get("request_id")), set()).add(str(r["error_class"]))
    sab_by_mode: dict[str, int] = {}
    caught_by_mode: dict[str, int] = {}
    missed = 0
    for rid, mode in sabotaged.items():
        sab_by_mode[mode] = sab_by_mode.get(mode, 0) + 1
        expected = EXPECTED_CLASSES.get(mode, frozenset())
        if expected and classes.get(rid, set()) & expected:
            caught_by_mode[mode] = caught_by_mode.get(mode, 0) + 1
        elif expected:
            missed += 1
    figures: dict[str, Any] = {
        "sabotaged_requests": len(sabotaged),
        "caught_requests": sum(caught_by_mode.values()),
        "missed_requests": missed,
        "sabotaged_by_mode": sab_by_mode,
        "caught_by_mode": caught_by_mode,
        "health_disagreement_s": _health_disagreement_s(ctx),
    }
    fault_at = min((float(f["fault_at"]) for f in sets if f.get("fault_at")), default=None)
    replicas = sorted({str(f.get("replica")) for f in sets})
    ground: dict[str, Any] = {
        "fault_at": fault_at,
        "cleared_at": min(
            (
                float(f["fault_at"])
                for f in clears
                if f.get("fault_at") and (fault_at is None or float(f["fault_at"]) >= fault_at)
            ),
            default=None,
        ),
        "replicas": replicas,
        "modes": sorted({str(f.get("mode")) for f in sets}),
        "sabotaged_request_ids": by_replica,
        "replica_exits": [],
    }
    if fault_at is not None:
        crash_fig, exits = crash_report(
            ctx.lab_events, ctx.ledger, ctx.records, replicas, fault_at, ctx.served_after
        )
        ground["replica_exits"] = exits
        if exits or CRASH_MODES & set(ground["modes"]):  # no crash rows for a hang that killed none
            figures.update(crash_fig)
            ground["crash_trigger"] = _trigger(sets, crash_fig)
    return figures, ground
