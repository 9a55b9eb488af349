"""Each drill's fault timeline and its confirmation by ground truth.

The judged windows follow the fault's own timeline, not a fixed delay: injection (``fault_at``)
to the return to service (``fault_end``), both read from the drill's ground truth
(``summary.json`` ``ground_truth``, unix seconds). A fault counts as *confirmed* only when the
ground truth shows it took effect (a kernel OOM kill, replicas that died, a freeze that held
requests, a spike that reached its rate); an unconfirmed fault makes the drill ``inconclusive``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Timeline", "timeline"]


@dataclass(frozen=True)
class Timeline:
    """A drill's fault timeline (unix seconds).

    Attributes:
        fault_at: injection (None: the fault never started).
        fault_end: return to service, or the end of the fault when nothing says it returned
            (None: unknown; the judge then uses the end of the load).
        confirmed: True (ground truth shows the fault acted), False (it shows it did not), None
            (this target has no ground truth for it).
        why: one line on the confirmation, for the reasons.
    """

    fault_at: float | None
    fault_end: float | None
    confirmed: bool | None
    why: str


def _f(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _latest(*values: Any) -> float | None:
    nums = [v for v in (_f(x) for x in values) if v is not None]
    return max(nums) if nums else None


def _exits(events: Sequence[Mapping[str, Any]], names: Sequence[str], after: float) -> set[str]:
    return {
        str(e.get("replica"))
        for e in events
        if e.get("event") == "exit"
        and str(e.get("replica")) in names
        and isinstance(e.get("t"), int | float)
        and float(e["t"]) >= after - 1.0
    }


def timeline(
    drill: str,
    ground: Mapping[str, Any],
    figures: Mapping[str, Any],
    lab_events: Sequence[Mapping[str, Any]] = (),
) -> Timeline:
    """The fault timeline of ``drill`` from its ground truth and figures.

    Args:
        drill: drill name.
        ground: the drill's ground truth.
        figures: the drill's figures.
        lab_events: the lab's ``events.jsonl`` ([] off the lab).

    Returns:
        A :class:`Timeline`. Off the lab (a Kubernetes target: the actions' figures), a fault
        whose action reported success reads ``confirmed`` None unless its own figures confirm it.
    """
    g, fig = ground, figures
    fault_at = _f(g.get("fault_at"))
    if fault_at is None:
        k8s = _k8s(g, fig)
        if k8s is not None:
            return k8s
        return Timeline(None, None, False, "no fault was recorded (the method did not inject it)")
    if drill == "node-loss":
        lost = list(g.get("lost_replica_names") or [])
        ok = bool(lost) and g.get("replicas_killed_at") is not None
        end = _latest(g.get("replica_serving_again_at"), g.get("node_up_at") if not ok else None)
        why = f"node {g.get('node')} dropped, replicas {', '.join(lost) or 'none'} killed"
        return Timeline(fault_at, end, ok, why if ok else "no replica died with the node")
    if drill == "oom-kill":
        kills = int(g.get("oom_kills") or 0)
        ok = kills >= 1 and g.get("death_cause") == "oom"
        end = _latest(g.get("replica_serving_again_at"), g.get("replica_ready_at"))
        why = (
            f"kernel OOM kill of {g.get('replica')} (oom_kill counter +{kills})"
            if ok
            else f"no kernel OOM kill recorded (oom_kill counter +{kills}, death cause "
            f"{g.get('death_cause')})"
        )
        return Timeline(fault_at, end, ok, why)
    if drill == "network-jitter":
        n = int(g.get("generations_on_replica_in_window") or 0)
        ok = g.get("mechanism") is not None and n > 0
        why = (
            f"{g.get('delay_ms')} ms +- {g.get('jitter_ms')} ms on {g.get('replica')} "
            f"({g.get('mechanism')}), {n} generations through it"
            if ok
            else "the jittered link carried no request"
        )
        return Timeline(fault_at, _f(g.get("cleared_at")), ok, why)
    if drill == "traffic-spike":
        # due by the schedule, sent or not: a request the full in-flight cap kept back was due
        # (the service held every slot), not a shortfall of the client
        due = int(fig.get("requests_during_spike") or 0)
        not_sent = int(fig.get("not_sent_during_spike") or 0)
        planned = _spike_planned(fig)
        ok = due > 0 and (planned is None or due >= 0.8 * planned)
        of = f" of {planned:.0f} planned" if planned is not None else ""
        split = (
            f": {due - not_sent} sent, {not_sent} not sent (in-flight cap full)" if not_sent else ""
        )
        why = (
            f"{due} requests due during the spike{of}{split}"
            if ok
            else f"the spike did not reach its rate ({due} due{of}{split})"
        )
        return Timeline(fault_at, _f(g.get("spike_end_at")), ok, why)
    if drill == "upstream-timeout":
        held = (
            int(fig.get("hung_requests") or 0) > 0
            or int(g.get("hung_sessions") or 0) > 0
            or int(fig.get("hung_sessions_max") or 0) > 0
            or g.get("ejected_at") is not None
        )
        why = (
            f"{g.get('replica')} {g.get('mode')} held requests or was ejected"
            if held
            else f"the {g.get('mode')} of {g.get('replica')} held no request and was never ejected"
        )
        return Timeline(fault_at, _latest(g.get("thawed_at"), g.get("held_until")), held, why)
    if drill == "simultaneous-restarts":
        names = [str(n) for n in g.get("replicas") or []]
        died = _exits(lab_events, names, fault_at) if lab_events else set(names)
        ok = bool(names) and died == set(names)
        why = (
            f"replicas {', '.join(sorted(died))} died at once"
            if ok
            else f"of {', '.join(names) or 'no replica'} only {', '.join(sorted(died)) or 'none'} died"
        )
        return Timeline(fault_at, _f(g.get("all_serving_at")), ok, why)
    if drill == "quota-cut":
        stopped = list(g.get("stopped") or [])
        serving = g.get("instances_serving_during_cut")
        ok = bool(stopped) and serving is not None and int(serving) <= int(g.get("quota") or 0)
        why = (
            f"cut to {g.get('quota')} instances ({', '.join(stopped)} stopped)"
            if ok
            else f"the cut did not take ({serving} serving for a quota of {g.get('quota')})"
        )
        end = _latest(g.get("lift_started_at"), g.get("restored_at"))
        return Timeline(_f(g.get("cut_done_at")) or fault_at, end, ok, why)
    if "sabotaged_request_ids" in g:  # an engine fault (evidence/kinds/engine_fault.py)
        return _engine_fault(g, fig, fault_at)
    return Timeline(fault_at, None, None, "no ground truth for this fault")


def _engine_fault(g: Mapping[str, Any], fig: Mapping[str, Any], fault_at: float) -> Timeline:
    """An engine fault (any drill running ``experiments/tools/engine-fault.yaml``), confirmed by
    the engine's own ledger: the drill's requests it sabotaged, and the exits of its replicas
    (``replica_exits``, with exit codes, restarts and the prompts they died on). The end of the
    fault stays unknown (None: the judge uses the end of the load), as before."""
    n = int(fig.get("sabotaged_requests") or 0)
    exits = [e for e in g.get("replica_exits") or [] if isinstance(e, Mapping)]
    modes = ", ".join(str(m) for m in g.get("modes") or []) or "engine fault"
    if not n and not exits:
        why = f"the armed {modes} sabotaged none of the drill's requests (engine ledger)"
        return Timeline(fault_at, None, False, why)
    parts = [f"{n} of the drill's requests sabotaged by {modes} (engine ledger)"]
    if exits:
        codes: dict[str, int] = {}
        for e in exits:
            codes[str(e.get("cause"))] = codes.get(str(e.get("cause")), 0) + 1
        restarted = sum(1 for e in exits if e.get("restarted_at") is not None)
        shown = ", ".join(f"{c} x{k}" for c, k in codes.items())
        parts.append(f"{len(exits)} replica exits ({shown}), {restarted} restarted")
    if g.get("crash_trigger"):
        parts.append(str(g["crash_trigger"]))
    return Timeline(fault_at, None, True, "; ".join(parts))


def _spike_planned(fig: Mapping[str, Any]) -> float | None:
    """Requests the schedule planned in the spike phase: the load's own count (``scheduled``),
    else its rate x the part of the phase the load ran."""
    rates = fig.get("phase_rates")
    if not isinstance(rates, list) or len(rates) < 2:
        return None
    peak = max(rates, key=lambda p: float(p.get("planned_rps") or 0.0))
    scheduled = _f(peak.get("scheduled"))
    if scheduled is not None:
        return scheduled
    planned, dur = _f(peak.get("planned_rps")), _f(peak.get("duration_s"))
    return planned * dur if planned is not None and dur is not None else None


def _k8s(ground: Mapping[str, Any], fig: Mapping[str, Any]) -> Timeline | None:
    """A Kubernetes drill: the actions' own record (``evidence/kinds/k8s_actions.py``): the
    injection from ``k8s_*_fault_at``, the return to service from the pods' recovery
    (``k8s_recovery_total_s_max``), confirmation from what the actions saw (an OOMKilled
    termination, deleted pods, recovered pods)."""
    k8s = {k: v for k, v in fig.items() if k.startswith("k8s_")}
    starts = [
        _f(v)
        for k, v in ground.items()
        if k.startswith("k8s_") and (k.endswith("fault_at") or k == "k8s_spike_at")
    ]
    start = min((t for t in starts if t is not None), default=None)
    if not k8s and start is None:
        return None
    total = _f(fig.get("k8s_recovery_total_s_max"))
    cleared = [
        _f(v) for k, v in ground.items() if k.startswith("k8s_") and k.endswith("cleared_at")
    ]
    end = start + total if start is not None and total is not None else None
    end = _latest(end, *cleared)
    if "k8s_oom_reason" in k8s:
        ok = k8s.get("k8s_oom_reason") == "OOMKilled"
        why = f"container termination reason {k8s.get('k8s_oom_reason')}"
        return Timeline(start, end, ok, why)
    if int(fig.get("k8s_simultaneous_deleted") or 0) > 0:
        n = int(fig["k8s_simultaneous_deleted"])
        return Timeline(start, end, True, f"{n} pods deleted at once (the API's own record)")
    if int(fig.get("k8s_freeze_stopped") or 0) > 0:
        n = int(fig["k8s_freeze_stopped"])
        return Timeline(start, end, True, f"{n} processes of the pod stopped (SIGSTOP confirmed)")
    before, after = fig.get("k8s_quota_replicas_before"), fig.get("k8s_quota_replicas_after")
    if isinstance(before, int) and isinstance(after, int):
        ok = after < before
        return Timeline(start, end, ok, f"replicas cut from {before} to {after} by the quota")
    if ground.get("k8s_spike_at") is not None:
        return Timeline(start, end, True, f"spike from the {ground.get('k8s_spike_source')}")
    if int(fig.get("k8s_recovery_pods") or 0) > 0:
        n = int(fig["k8s_recovery_pods"])
        return Timeline(start, end, True, f"{n} pods disrupted and observed (the API's record)")
    return Timeline(start, end, None, "the fault actions' own report (no lab ground truth)")
