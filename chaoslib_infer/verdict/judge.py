"""The verdict of one drill: state, reasons, and one judged row per criterion.

States (``docs/definitions.md``, "Verdicts"), in order of precedence:

- ``aborted``: the run was stopped (Ctrl-C, SIGTERM, a stop condition);
- ``error``: the tool failed (a method action crashed, a figure could not be computed, the load
  could not start);
- ``failed``: a fault was left behind after the rollbacks (residue), the service did not meet
  its SLOs before the fault (reported as such, never blamed on the fault; a service that
  answered nothing during the load's warm-up among them), or a criterion is broken; each reason
  names the figure, its value and its threshold;
- ``inconclusive``: the drill cannot answer its question: the fault is not confirmed by ground
  truth, the client itself fell behind its schedule (its own lag from the schedule to the send,
  or from the kernel's receive stamp to its handling; the reason says which, and its CPU), a
  load worker was lost mid-drill (the load was not what was planned), a judged window holds too
  few requests, or a key figure is unmeasured on this target;
- ``passed``: none of the above.

Failed outranks inconclusive when its evidence does not depend on the client's schedule
(:data:`~chaoslib_infer.verdict.state.CLIENT_INDEPENDENT`: timeouts, 5xx and other failed
answers, wrong or empty content, requests not sent because the service held every slot,
duplicates; the method's findings; a defect before the fault): the inconclusive reasons are
listed beside, each ``"also inconclusive: ..."``. Requests ``not_sent`` (due while the load's
in-flight cap was full) count against the service when the client kept up; when it fell behind,
every figure is judged without them, and without its timeouts when its lag is large against the
deadline (:mod:`chaoslib_infer.verdict.client`), their rows reading ``n/a``.

Residue wins over ``error`` and a stop condition (a fault left behind fails, whatever else
happened), but not over an interrupted run (Ctrl-C, SIGTERM): that one reads ``aborted`` so the
game day stops (exit 130), the residue listed right after ``stopped: ...``, never hidden.
A figure kind that could not be computed (:func:`figure_error_reason`) makes the drill ``error``;
under a residue or an abort, which outrank it, it is still listed after their reasons, so a
failed figure never goes unseen.
A row reads ``pass``, ``fail``, ``not judged`` (no threshold), ``unmeasured`` (no value) or
``n/a`` (the figure does not apply to this run, e.g. no request was shed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from chaoslib_infer.measure.figures import RECOVERY_UNMEASURED, interruption, recovery_outcome
from chaoslib_infer.measure.health import health_disagreement
from chaoslib_infer.measure.inflight import cut_off_timeouts
from chaoslib_infer.measure.metrics import (
    TIMEOUT_CLASSES,
    logical_outcomes,
    retry_stats,
    select,
    window_stats,
)
from chaoslib_infer.measure.retrycost import retried

from . import client as vclient
from .applicable import instances_held, not_happened
from .attribution import assign, crossed_note, ttft_allowance
from .blame import SLOWING, add_blame
from .budget import budget_values, name_lost_row
from .confirm import confirm_by_traffic
from .criteria import GATEWAY_ONLY, MIN_REQUESTS, Criterion, criteria_for
from .episodes import name_episode_row
from .facts import STATES, DrillFacts, Verdict, format_value, num
from .mitigation import (
    exits_in,
    fault_over,
    is_engine_fault,
    judge_back,
    judge_mitigated,
    mitigation_records,
    mitigation_time,
    mitigation_window,
    recovery_values,
)
from .policy import apply_policy
from .provider_errors import provider_error_rows
from .spike import spike_values
from .state import (
    CLIENT_LAG,
    FIGURE_ERROR_PREFIX,
    LOAD_ERROR_PREFIX,
    LOAD_LOST_PREFIX,
    NEVER,
    client_bound,
    decide_state,
    exit_code,
    figure_error_reason,
    judged_row,
    request_stats,
)
from .steady import judge_after_rows, power_note, slo_tests, tests_evidence
from .timeline import Timeline, timeline

__all__ = [
    "CLIENT_LAG",
    "FIGURE_ERROR_PREFIX",
    "LOAD_ERROR_PREFIX",
    "LOAD_LOST_PREFIX",
    "NEVER",
    "STATES",
    "DrillFacts",
    "Verdict",
    "exit_code",
    "figure_error_reason",
    "format_value",
    "judge_drill",
]

#: The after window opens this long after the return to service (s): the state the service
#: settles in is judged, not the first seconds of a replica's comeback (the interruption's
#: settling window).
SETTLE_AFTER_S = 5.0
#: Minimum length of the fault window (s): an instantaneous fault (a kill) still gets a window
#: long enough to hold requests.
MIN_FAULT_WINDOW_S = 5.0


def _span(records: Sequence[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    sent = [float(r["sent_at"]) for r in records if isinstance(r.get("sent_at"), int | float)]
    ends = [float(r["end_at"]) for r in records if isinstance(r.get("end_at"), int | float)]
    if not sent:
        return None, None
    return min(sent), max([*sent, *ends])


def _timeouts(records: Sequence[Mapping[str, Any]], a: float, b: float) -> int:
    return sum(
        1
        for r in select(logical_outcomes(list(records)), a, b)
        if r.get("error_class") in TIMEOUT_CLASSES
    )


def _max_wait(records: Sequence[Mapping[str, Any]], a: float, b: float) -> float | None:
    waits = [
        float(r["end_at"]) - float(r["sent_at"])
        for r in select(list(records), a, b)
        if isinstance(r.get("end_at"), int | float)
    ]
    return max(waits) if waits else None


def _faulted(ground: Mapping[str, Any]) -> list[str]:
    rep = ground.get("replica")
    names = [str(rep)] if isinstance(rep, str) and rep else []
    for key in ("lost_replica_names", "replicas"):
        names += [str(n) for n in ground.get(key) or [] if str(n) not in names]
    return names


def _health(
    facts: DrillFacts, records: list[dict[str, Any]], a: float, b: float
) -> tuple[float | None, dict[str, int]]:
    """Health disagreement (``docs/definitions.md``, "Drill figures") of the faulted replicas in
    the fault window: the gateway's health view (HAProxy's checks in the lab's ``lb_state``
    samples: the replica's server, or its run-time detour ``<name>-...``, UP) against its
    completions (:func:`chaoslib_infer.measure.health.health_disagreement`, 1 s windows); in a
    drill that only slows the replica (:data:`~chaoslib_infer.verdict.blame.SLOWING`) the
    client's own attempt timeouts are left out: the replica was answering.
    Returns ``(seconds, {error class: failed attempts counted})``: who caused those failures
    is the row's blame (:func:`chaoslib_infer.verdict.blame.blame_of`)."""
    names = _faulted(facts.ground)
    states = sorted(
        (
            e
            for e in facts.lab_events
            if e.get("event") == "lb_state"
            and isinstance(e.get("t"), int | float)
            and isinstance(e.get("servers"), dict)
        ),
        key=lambda e: float(e["t"]),
    )
    # the recorder writes a snapshot when a state changes: the one before the window holds at a
    before = [e for e in states if float(e["t"]) < a][-1:]
    snaps = [{**e, "t": a} for e in before] + [e for e in states if a <= float(e["t"]) <= b]
    if not names or not snaps:
        return None, {}
    snaps.append({**snaps[-1], "t": b})
    samples = [
        {
            "t": float(e["t"]),
            "replica": n,
            "healthy": any(
                v == "UP" and (k == n or str(k).startswith(n + "-"))
                for k, v in e["servers"].items()
            ),
        }
        for e in snaps
        for n in names
    ]
    if facts.drill in SLOWING:  # the replica was answering, only slower: the client's own
        # attempt timeouts are not failures its health checks could see (the retry-cost rows
        # judge what they cost); only the upstream's own failures count
        records = [r for r in records if r.get("ok") or r.get("error_class") not in TIMEOUT_CLASSES]
    result = health_disagreement(samples, records, 1.0, replica_of=facts.replica_of)
    return float(result["disagreement_s"]), dict(result["failed_classes"])


def _survivor_share(
    facts: DrillFacts, records: Sequence[Mapping[str, Any]]
) -> tuple[float | None, str | None]:
    """The largest survivor's share of the survivors' attempts in ``records`` (the fault
    window's)."""
    survivors = [str(s) for s in facts.ground.get("survivors") or []]
    if len(survivors) < 2:
        return None, f"{len(survivors)} survivor(s): one replica must carry everything"
    counts = {s: 0 for s in survivors}
    for r in select(list(records), None, None):
        rep = r.get("replica")
        if rep in counts:
            counts[str(rep)] += 1
    total = sum(counts.values())
    return (max(counts.values()) / total if total else None), None


def _values(
    facts: DrillFacts,
    tl: Timeline,
    w: dict[str, tuple[float, float]],
    sel: Callable[[str], list[dict[str, Any]]],
    failures: dict[str, dict[str, int]],
) -> dict[str, tuple[float | None, str | None]]:
    """``{criterion name: (value, note)}``; a note with value None means ``n/a``. ``failures``
    receives ``{criterion: {error class: failed attempts}}`` of the rows that count failures
    (their blame, :func:`chaoslib_infer.verdict.blame.add_blame`)."""
    fig, recs = facts.figures, facts.records
    drill = request_stats(sel("drill"), None, None)
    fault = request_stats(sel("fault"), None, None) if "fault" in w else {}
    after = request_stats(sel("after"), None, None) if "after" in w else {}
    base = request_stats(sel("baseline"), None, None) if "baseline" in w else {}
    out: dict[str, tuple[float | None, str | None]] = {
        "availability": (num(drill.get("availability")), None),
        "availability_fault": (num(fault.get("availability")), None),
        "timeout_rate": (num(drill.get("timeout_rate")), None),
        "timeout_rate_fault": (num(fault.get("timeout_rate")), None),
        "error_rate": (num(drill.get("error_rate")), None),
        "not_sent": (num(drill.get("not_sent")), None),
        "p99_e2e_s": (num(drill.get("p99_e2e_s")), None),
        "p99_e2e_fault_s": (num(fault.get("p99_e2e_s")), None),
        "send_lag_p99_s": (num(drill.get("p99_send_lag_s")), None),
        "client_lag_p99_s": (num(drill.get("p99_client_lag_s")), None),
        "health_disagreement_s": (num(fig.get("health_disagreement_s")), None),
    }
    if out["health_disagreement_s"][0] is None and "fault" in w:
        seconds, failures["health_disagreement_s"] = _health(facts, sel("fault"), *w["fault"])
        out["health_disagreement_s"] = (seconds, None)
    before, end = facts.serving
    out["serving_after_vs_baseline"] = (
        (end / before, None) if before and end is not None else (None, None)
    )
    bp, ap = num(base.get("p99_e2e_s")), num(after.get("p99_e2e_s"))
    if int(after.get("requests") or 0) < MIN_REQUESTS["fault"]:
        out["p99_after_vs_baseline"] = (None, None)
    else:
        out["p99_after_vs_baseline"] = ((ap / bp) if bp and ap is not None else None, None)
    for name in (
        "interruption_s",
        "replacement_serving_s",
        "restart_s",
        "warmup_ratio",
        "scale_out_s",
        "ejection_s",
        "all_serving_s",
        *GATEWAY_ONLY,
    ):
        out[name] = (num(fig.get(name)), None)
    for name, alias in K8S_ALIASES.items():  # a cluster: the actions' own figures
        if out[name][0] is None and num(fig.get(alias)) is not None:
            out[name] = (num(fig.get(alias)), None)
    sustained = fig.get("interruption_sustained", fig.get("interruption_settled"))
    intr: Mapping[str, Any] = fig
    if "interruption_s" not in fig and tl.fault_at is not None:
        # no drill-specific figure (a cluster): the one shared computation over the records
        intr = interruption(recs, tl.fault_at)
        out["interruption_s"] = (float(intr["interruption_s"]), None)
        sustained = intr["sustained"]
    out["interruption_sustained"] = (num(sustained) if sustained is not None else None, None)
    if sustained is not None and _interrupted(intr) is False:
        out["interruption_sustained"] = (None, NO_INTERRUPTION)
    out["oom_kills"] = (num(facts.ground.get("oom_kills")), None)
    out.update(_retry_cost(facts))
    out.update(provider_error_rows(fig))
    if "fault" in w:
        a, b = w["fault"]
        recs = sel("fault")
        a, b = float("-inf"), float("inf")
        out["timeouts_fault"] = (float(_timeouts(recs, a, b)), None)
        hung = fig.get("hung_requests")
        if hung is None and facts.drill == "upstream-timeout":
            # no drill figure (a cluster): attempts of the fault window the client gave up on
            hung = sum(
                1
                for r in recs
                if r.get("error_class") in TIMEOUT_CLASSES and not r.get("in_flight_at_judging")
            )
        hung_now = sum(1 for r in select(recs, a, b) if r.get("in_flight_at_judging"))
        out["hung_requests"] = (
            (float(int(hung) + hung_now), None) if hung is not None else (None, None)
        )
        out["max_wait_s"] = (_max_wait(recs, a, b), None)
        share, why = _survivor_share(facts, recs)  # the fault window's, not the whole drill's
        out["max_survivor_share"] = (share, why)
    # the replicas (pods) that served during the cut against the quota, and the load each carried
    out["instances_held"] = instances_held(facts, sel("fault") if "fault" in w else [], tl.fault_at)
    if out["scale_out_s"][0] is None:
        wanted, serving = num(fig.get("k8s_hpa_desired_at_s")), num(fig.get("k8s_serving_at_s"))
        if wanted is not None and serving is not None:  # HPA desired -> new pod serving
            out["scale_out_s"] = (serving - wanted, None)
    rec = num(fig.get("recovery_s"))
    if "recovery_s" not in fig and "baseline" in w:
        # no drill figure (a cluster, a drill whose room computes none): the shared computation
        # from the injection (traffic-spike: from the end of the spike, its own question)
        base_stats = window_stats(sel("baseline"))
        if base_stats.get("p99_e2e_s") is not None and tl.fault_at is not None:
            start = tl.fault_end or tl.fault_at if facts.drill == "traffic-spike" else tl.fault_at
            rec, why = recovery_outcome(facts.records, start, base_stats)
            fig = {**fig, "recovery_s": rec, "recovery_note": why}
    out["recovery_s"] = (rec, None)
    note = fig.get("recovery_note")
    if rec is None and isinstance(note, str) and note:
        # never back (fail), or unmeasured as the load ended first (measure/figures.py)
        out["recovery_s"] = (None, note)
    elif rec is None and "recovery_s" in fig and w.get("after"):
        # a figure without its note (older evidence): measured and never back
        out["recovery_s"] = (None, NEVER + "back inside the baseline bands before the load ended")
    out.update(not_happened(facts))
    out.update(budget_values(facts, tl, w, sel))
    if facts.drill == "traffic-spike" and out["scale_out_s"][0] is None and "fault" in w:
        failed = sum(1 for r in sel("fault") if not r.get("ok") and not r.get("cut_off"))
        out["scale_out_s"] = (
            (None, NEVER + f"scaled out while {failed} requests failed during the spike")
            if failed
            else (None, "the spike was carried without a scale-out")
        )
    return out


#: The retry-cost rows' note in a drill where neither the client nor the gateway retried.
NO_RETRY = "no client or gateway retry in this drill: nothing to cost"


def _retry_cost(facts: DrillFacts) -> dict[str, tuple[float | None, str | None]]:
    """The retry-cost rows (``drills/criterion.py`` ``retry_cost``) over the whole drill:
    ``n/a`` (:data:`NO_RETRY`) in a drill where neither the client nor the gateway retried
    (:func:`chaoslib_infer.measure.retrycost.retried`; network-jitter, whose question they
    answer, judges them always); the engine-side figures unmeasured without an engine ledger
    (``DrillFacts.ledger_measured``), never 0. They count what the client or gateway caused:
    the fault's re-runs (``rerun_generations``, :mod:`chaoslib_infer.measure.rerun`) are left
    out, and said so in the ``duplicate_generations`` row's note, as is ``frozen_completed``
    (duplicates the client's timeout caused)."""
    fig = facts.figures
    retries = num(fig.get("retries"))
    if retries is None:
        retries = float(retry_stats(facts.records)["retries"])
    names = ("duplicate_generations", "extra_generations", "wasted_tokens", "retry_amplification")
    if facts.drill != "network-jitter" and not retried(fig, facts.records):
        return {n: (None, NO_RETRY) for n in (*names, "retries")}
    out: dict[str, tuple[float | None, str | None]] = {"retries": (retries, None)}
    for name in names:
        value = num(fig.get(name))
        if name == "duplicate_generations" and value is None:
            value = num(fig.get("duplicates"))
        # None (no ledger, no generation_end lines, a duplicate without one): "unmeasured"
        out[name] = (value if facts.ledger_measured else None, None)
    frozen, reruns = num(fig.get("frozen_completed")), num(fig.get("rerun_generations"))
    notes = []
    if frozen:  # measure/rerun.py: the frozen replica resumed them after the thaw
        notes.append(
            f"{frozen:g} generated again by the frozen replica after it thawed, the client having "
            "given up on it: its timeout caused them (frozen_completed)"
        )
    if reruns:  # the fault's, not counted here (measure/rerun.py)
        notes.append(
            f"{reruns:g} re-runs of generations the fault aborted are the fault's cost, not "
            "counted (rerun_generations)"
        )
    value = out["duplicate_generations"][0]
    if notes and value is not None:  # a note without a value would read n/a: only beside one
        out["duplicate_generations"] = (value, "; ".join(notes))
    return out


def _selector(
    facts: DrillFacts, tl: Timeline, w: dict[str, tuple[float, float]]
) -> tuple[Callable[[str], list[dict[str, Any]]], dict[str, Any]]:
    """The attempts of each named window, assigned once by logical request with the crossing
    rule at the injection (:func:`chaoslib_infer.verdict.attribution.assign`; every criterion
    of a window reads the same list), and the ``crossed_injection`` entry."""
    allowance, p99 = (
        ttft_allowance(facts.records, tl.fault_at, facts.deadline_s)
        if tl.fault_at is not None
        else (0.0, None)
    )
    got = assign(facts.records, w, tl.fault_at, allowance, p99)

    def sel(name: str) -> list[dict[str, Any]]:
        return got.windows[name]

    return sel, got.crossed


def _windows(
    facts: DrillFacts, tl: Timeline, mitigation_s: float
) -> dict[str, tuple[float, float]]:
    """The judged windows ``{name: (start, end)}``: ``drill``, ``baseline``, ``fault``, the
    ``mitigation`` window (from ``mitigation_s`` after the injection to the fault's end, where
    the fault lasted longer: :func:`chaoslib_infer.verdict.mitigation.mitigation_window`) and
    ``after`` (:data:`SETTLE_AFTER_S` after the fault's end to the end of the load)."""
    lo, hi = _span(facts.records)
    if lo is None or hi is None:
        return {}
    hi += 1e-6
    w: dict[str, tuple[float, float]] = {"drill": (lo, hi)}
    if tl.fault_at is not None and lo < tl.fault_at:
        w["baseline"] = (lo, tl.fault_at)
    if tl.fault_at is not None:
        end = tl.fault_end if tl.fault_end is not None else hi
        end = min(max(end, tl.fault_at + MIN_FAULT_WINDOW_S), hi)
        w["fault"] = (tl.fault_at, end)
        mit = mitigation_window(tl.fault_at, tl.fault_end, hi, mitigation_s)
        if mit is not None:
            w["mitigation"] = (mit[0], min(mit[1], hi))
        if end + SETTLE_AFTER_S < hi:
            w["after"] = (end + SETTLE_AFTER_S, hi)
    return w


def _window_info(
    w: dict[str, tuple[float, float]],
    sel: Callable[[str], list[dict[str, Any]]],
    crossed: Mapping[str, Any],
) -> dict[str, dict[str, Any]]:
    """``{window: {"start", "end", "requests" (logical), "attempts"}}`` for the verdict; the
    fault window also carries ``crossed_injection`` (where the attempts on the wire at the
    injection went, :class:`chaoslib_infer.verdict.attribution.Assignment`)."""
    info: dict[str, dict[str, Any]] = {
        name: {
            "start": a,
            "end": b,
            "requests": len(select(logical_outcomes(sel(name)), None, None)),
            "attempts": len(select(sel(name), None, None)),
        }
        for name, (a, b) in w.items()
    }
    if crossed and "fault" in info:
        info["fault"]["crossed_injection"] = dict(crossed)
    return info


#: The sustained row's note when nothing was interrupted: nothing to sustain, never a pass.
NO_INTERRUPTION = (
    RECOVERY_UNMEASURED + "no interruption observed (no failed request after the fault): "
    "nothing was seen to be sustained again"
)


def _interrupted(intr: Mapping[str, Any]) -> bool | None:
    """Whether the interruption figures (:func:`chaoslib_infer.measure.figures.interruption`,
    or a drill's figures carrying them) saw a failure after the fault: its ``first_failure_at``,
    else its ``failed_requests``; None when they do not say."""
    if "first_failure_at" in intr:
        return intr["first_failure_at"] is not None
    failed = num(intr.get("failed_requests"))
    return None if failed is None else failed > 0


#: The schedule-lag row's note under a closed-loop load (``DrillFacts.closed_loop``).
CLOSED_LOOP_LAG = "not measured: a closed-loop load has no schedule (intended_at equals sent_at)"


#: Kubernetes drills: the actions' own figure standing for a drill figure the lab computes.
K8S_ALIASES = {
    "all_serving_s": "k8s_recovery_total_s_max",
    "replacement_serving_s": "k8s_recovery_total_s_max",
    "restart_s": "k8s_oom_restart_s",
}


_Judged = tuple[
    Timeline,
    dict[str, tuple[float, float]],
    Callable[[str], list[dict[str, Any]]],
    dict[str, dict[str, Any]],
    list[dict[str, Any]],
]


def _judged(facts: DrillFacts, crits: Sequence[Criterion]) -> _Judged:
    """``(timeline, windows, selector, window info, judged rows)`` of ``facts``."""
    tl = timeline(facts.drill, facts.ground, facts.figures, facts.lab_events)
    tl = confirm_by_traffic(tl, facts.drill, facts.ground, facts.records, facts.replica_of)
    tl = fault_over(tl, facts.ground)  # an engine fault ends at its clear
    mitigation_s, source = mitigation_time(facts.drill, crits, is_engine_fault(facts.ground))
    w = _windows(facts, tl, mitigation_s)
    sel, crossed = _selector(facts, tl, w)
    info = _window_info(w, sel, crossed)
    failures: dict[str, dict[str, int]] = {}  # the failures a row counts, by error class
    values = _values(facts, tl, w, sel, failures) if w else {}
    if facts.drill == "traffic-spike":  # shedding as its own class (verdict/spike.py)
        values.update(spike_values(crits, w, sel))
    mitigated = mitigation_records(facts.drill, crits, w, sel)
    slo = facts.policy.slo_availability
    if w:
        values.update(
            recovery_values(
                facts.drill, tl, w, mitigated, sel, (mitigation_s, source), slo, SETTLE_AFTER_S
            )
        )
    if "mitigation" in info:
        info["mitigation"].update(mitigation_s=mitigation_s, source=source)
    rows = [judged_row(c, *values.get(c.name, (None, None))) for c in crits]
    latency = not client_bound(rows)  # a client that fell behind: its latencies are suspect
    if "after" in w:  # an SLO rate of the after window: the binomial test (verdict/steady.py)
        judge_after_rows(rows, sel("after"), facts.window_settings)
        judge_back(rows, sel("after"), crits, facts.window_settings, latency)
    if "mitigation" in w:  # the fault still on after its mitigation time (verdict/mitigation.py)
        exits = exits_in(facts.ground, *w["mitigation"])
        judge_mitigated(rows, mitigated, crits, slo, facts.window_settings, exits, latency)
    rows = name_lost_row(rows, sel("fault") if "fault" in w else None)
    rows = name_episode_row(rows, facts, tl.fault_at)  # every episode out of SLO, named
    blamed = add_blame(apply_policy(rows, facts.policy), facts, failures, {n: sel(n) for n in w})
    return tl, w, sel, info, blamed


def _without_client_outcomes(
    facts: DrillFacts, crits: Sequence[Criterion], rows: list[dict[str, Any]]
) -> _Judged:
    """The judgement of ``facts`` without the outcomes a client that itself fell behind may have
    made (:mod:`chaoslib_infer.verdict.client`: its ``not_sent`` requests, and its timeouts when
    its lag is large against the deadline), keeping ``rows``' client rows (its lag as measured
    on every record) and reading the rows of what was left out ``n/a``, counted in their note."""
    lag = vclient.client_lag(rows) or 0.0
    timeouts = lag >= vclient.CLIENT_TIMEOUT_SHARE * facts.deadline_s
    kept, not_sent, timed_out = vclient.left_out(facts.records, timeouts)
    tl, w, sel, info, again = _judged(replace(facts, records=kept), crits)
    client = {r["criterion"]: r for r in rows if r["criterion"] in CLIENT_LAG}
    out = [client.get(r["criterion"], r) for r in again]
    out = vclient.mark_left_out(out, not_sent, timed_out if timeouts else None, lag)
    return tl, w, sel, info, out


def judge_drill(
    facts: DrillFacts,
    overrides: Mapping[str, Any] | None = None,
    min_requests: Mapping[str, int] | None = None,
) -> Verdict:
    """Judge one drill.

    Args:
        facts: what the drill measured and what the lab recorded.
        overrides: ``{criterion name: threshold | None | "off"}``
            (:func:`chaoslib_infer.verdict.criteria.criteria_for`).
        min_requests: minimum requests per judged window (default :data:`MIN_REQUESTS`).

    Returns:
        The :class:`Verdict`.

    Raises:
        ValueError: an override names no criterion of this drill.
    """
    crits = criteria_for(facts.drill, overrides, is_engine_fault(facts.ground))
    # an attempt still in flight past the deadline when the load stopped is a timeout
    facts = replace(facts, records=cut_off_timeouts(facts.records, facts.deadline_s))
    if "gateway" not in facts.figures:  # a HAProxy lab, a cluster: no gateway figures
        crits = [c for c in crits if c.name not in GATEWAY_ONLY]
    mins = {**MIN_REQUESTS, **(min_requests or {})}
    tl, w, sel, info, rows = _judged(facts, crits)
    if facts.closed_loop:
        for r in rows:
            if r["criterion"] == "send_lag_p99_s":  # intended_at == sent_at: nothing measured
                r.update(value=None, result="unmeasured", note=CLOSED_LOOP_LAG)
    if client_bound(rows):  # the client's own lag may have filled its cap: judge without those
        tl, w, sel, info, rows = _without_client_outcomes(facts, crits, rows)
    notes: list[str] = [f"fault: {tl.why}", f"verdict policy: {facts.policy.name}"]
    if facts.closed_loop:
        notes.append(f"load: {facts.closed_loop}")
    notes += [f"load: {line}" for line in facts.load_lost]
    if tl.confirmed is None:  # on the lab: ground truth exists, but none for this fault
        notes.append(
            "fault confirmation: the lab recorded no ground truth for this fault"
            if facts.lab_events
            else "fault confirmation: no lab ground truth on this target"
        )
    if w.get("fault"):
        a, b = w["fault"]
        notes.append(f"fault window: {b - a:.1f} s from injection to the return to service")
    note = crossed_note(info.get("fault", {}).get("crossed_injection") or {})
    if note:
        notes.append(note)
    for name in ("baseline", "after"):  # the steady-state windows' stated error rates
        if name in w:
            tests = slo_tests(sel(name), crits, facts.window_settings, not client_bound(rows))
            info[name]["slo_tests"] = tests_evidence(tests)
            short = power_note(name, tests) if name == "baseline" else None
            if short:
                notes.append(short)
    state, reasons = decide_state(facts, tl, rows, info, w, mins, crits, sel)
    return Verdict(state, reasons, rows, info, notes)
