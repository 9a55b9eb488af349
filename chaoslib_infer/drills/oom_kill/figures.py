"""Figures of the ``oom-kill`` fault: interruption, restart, first-request warm-up.

Definitions: ``docs/definitions.md`` ("Drill figures"). Ground truth: the fault log (cgroup
``oom_kill`` counter before/after), the lab's exit/ready events, and the first request the replica
served again (engine ledger / HAProxy log).
"""

from __future__ import annotations

from typing import Any

from chaoslib_infer.drills.interruption import interruption_figures
from chaoslib_infer.measure import figures as mfig
from chaoslib_infer.measure.crashes import crash_report
from chaoslib_infer.measure.figkit import MILESTONE, RECOVERY, DrillContext, Marker, mark, num

__all__ = ["LEDGER_LABELS", "compute", "markers"]

#: Timeline labels of the lab's fault-ledger events: the memory hog is started in the replica's
#: cgroup (the kernel's kill follows) and removed once the kill is recorded.
LEDGER_LABELS = ("memory hog started", "memory hog removed")


def markers(ground: dict[str, Any], figures: dict[str, Any]) -> list[Marker]:
    """Timeline markers: the replica's death (cause), ready again, first request served again."""
    r = ground.get("replica")
    cause = ground.get("death_cause")
    died = f"{r} OOM-killed" if cause == "oom" else f"{r} died ({cause})"
    return [
        *mark(ground.get("replica_died_at"), died, MILESTONE),
        *mark(ground.get("replica_ready_at"), f"{r} ready (health 200)", RECOVERY),
        *mark(ground.get("replica_serving_again_at"), f"{r} serving again", RECOVERY),
    ]


def compute(ctx: DrillContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(figures, ground_truth)`` for the last ``oom-kill`` fault of the run.

    Figures: ``interruption_s``, ``failed_requests``, ``restart_s`` (client view: death to the first
    successful response from the restarted replica), ``restart_s_ground_truth``, ``warmup_ttft_s``
    (mean TTFT of its first 3 requests), ``steady_ttft_p50_s`` (before the fault), and the
    crashes told whole (:func:`chaoslib_infer.measure.crashes.crash_report` over the replica's
    exits since the fault): ``replica_exits``, ``replica_restarts``, ``exit_codes``,
    ``restarts_unserved``, ``crash_prompt_tokens`` and their source.
    Ground truth: ``fault_at``, ``replica``, ``oom_kills`` (counter delta), ``replica_died_at``,
    ``death_cause``, ``replica_ready_at``, ``replica_serving_again_at``, ``replica_exits`` (each
    exit: cause, status, restart and serving-again times, the requests it died on),
    ``crash_trigger`` (one line: the memory hog, and the prompts in flight on the killed process).
    """
    fault = ctx.last_fault("oom-kill")
    if fault is None:
        return {}, {}
    figures: dict[str, Any] = {}
    ground: dict[str, Any] = {}
    fault_at = float(fault["fault_at"])
    replica = str(fault["replica"])
    ground["fault_at"] = fault_at
    ground["replica"] = replica
    ground["oom_kills"] = int(fault.get("oom_kills_after", 0)) - int(
        fault.get("oom_kills_before", 0)
    )
    died = next(
        (
            e
            for e in ctx.lab_events
            if e.get("event") == "exit"
            and e.get("replica") == replica
            and float(e["t"]) >= fault_at - 1.0
        ),
        None,
    )
    died_at = float(died["t"]) if died else fault_at
    ground["replica_died_at"] = died_at
    ground["death_cause"] = died.get("cause") if died else None
    ready = next(
        (
            e
            for e in ctx.lab_events
            if e.get("event") == "ready" and e.get("replica") == replica and float(e["t"]) > died_at
        ),
        None,
    )
    ground["replica_ready_at"] = float(ready["t"]) if ready else None
    serving_again = ctx.served_after(replica, died_at) if ctx.served_after else None
    ground["replica_serving_again_at"] = serving_again

    intr = mfig.interruption(ctx.records, fault_at)
    figures.update(interruption_figures(intr))
    figures["restart_s"] = num(mfig.restart_from_records(ctx.records, replica, died_at))
    figures["restart_s_ground_truth"] = (serving_again - died_at) if serving_again else None
    steady = num(mfig.steady_ttft_p50(ctx.records_before(fault_at), None, None))
    warm = mfig.warmup(ctx.records, replica, died_at, k=3, steady_p50_ttft_s=steady)
    figures["warmup_ttft_s"] = num(warm.get("mean_ttft_s"))
    figures["warmup_ratio"] = num(warm.get("ratio_to_steady"))
    figures["warmup"] = warm
    figures["steady_ttft_p50_s"] = steady
    # every exit of the replica since the fault: restarts, exit codes, the requests it died on
    crash_fig, exits = crash_report(
        ctx.lab_events, ctx.ledger, ctx.records, [replica], fault_at - 1.0, ctx.served_after
    )
    figures.update({k: v for k, v in crash_fig.items() if k != "restart_s"})  # restart_s: above
    ground["replica_exits"] = exits
    sizes = crash_fig["crash_prompt_tokens"]
    ground["crash_trigger"] = (
        f"memory hog in {replica}'s cgroup; in flight on the killed process: prompts of "
        f"{', '.join(map(str, sizes))} tokens ({crash_fig['crash_prompt_tokens_source']} count)"
        if sizes
        else f"memory hog in {replica}'s cgroup; no request in flight on the killed process"
    )
    return figures, ground
