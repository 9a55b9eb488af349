"""The verdict of one drill: state, reasons, and one judged row per criterion.

States (``docs/definitions.md``, "Verdicts"), in order of precedence:

- ``aborted``: the run was stopped (Ctrl-C, SIGTERM, a stop condition);
- ``error``: the tool failed (a method action crashed, a figure could not be computed, the load
  could not start);
- ``failed``: a fault was left behind after the rollbacks (residue), the service did not meet
  its SLOs before the fault (reported as such, never blamed on the fault), or a criterion is
  broken; each reason names the figure, its value and its threshold;
- ``inconclusive``: the drill cannot answer its question: the fault is not confirmed by ground
  truth, the client fell behind its schedule, a load worker was lost mid-drill (the load was not
  what was planned), a judged window holds too few requests, or a key figure is unmeasured on
  this target;
- ``passed``: none of the above.

Residue wins over ``aborted`` and ``error`` (a fault left behind fails, whatever else happened).
A figure kind that could not be computed (:func:`figure_error_reason`) makes the drill ``error``;
under a residue or an abort, which outrank it, it is still listed after their reasons, so a
failed figure never goes unseen.
A row reads ``pass``, ``fail``, ``not judged`` (no threshold), ``unmeasured`` (no value) or
``n/a`` (the figure does not apply to this run, e.g. no request was shed).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from chaoslib_infer.drills.traffic_spike.figures import is_shed, non_shed_failures
from chaoslib_infer.measure.figures import interruption, recovery
from chaoslib_infer.measure.health import health_disagreement
from chaoslib_infer.measure.inflight import DEFAULT_DEADLINE_S, cut_off_timeouts
from chaoslib_infer.measure.metrics import (
    TIMEOUT_CLASSES,
    logical_outcomes,
    logical_stats,
    percentiles_s,
    select,
    window_stats,
)

from .criteria import GATEWAY_ONLY, MIN_REQUESTS, Criterion, criteria_for
from .timeline import Timeline, timeline

__all__ = [
    "STATES",
    "DrillFacts",
    "Verdict",
    "exit_code",
    "figure_error_reason",
    "format_value",
    "in_window",
    "judge_drill",
]

#: Verdict states, worst first as the game day's exit code reads them.
STATES = ("failed", "error", "aborted", "inconclusive", "passed")
#: The after window opens this long after the return to service (s): the state the service
#: settles in is judged, not the first seconds of a replica's comeback (the interruption's
#: settling window).
SETTLE_AFTER_S = 5.0
#: Minimum length of the fault window (s): an instantaneous fault (a kill) still gets a window
#: long enough to hold requests.
MIN_FAULT_WINDOW_S = 5.0

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
}


@dataclass
class DrillFacts:
    """Everything a verdict reads (unix seconds).

    Attributes:
        drill: drill name.
        records: attempt records (cut-off ones included: one in flight past ``deadline_s``
            when the load stopped is judged as a timeout; in-flight timeouts added by the caller
            when judging a live run).
        figures: the drill's figures. ground: its ground truth.
        lab_events: the lab's events ([] off the lab).
        ledger_measured: whether an engine generation ledger exists for this target (else
            duplicate generations are unmeasured, never 0).
        journal_status: ``drill_status`` of the journal (``passed``, ``deviated``, ``error``,
            ``aborted``) or None.
        hypothesis_failures: one line per steady-state probe that deviated, with its phase.
        findings: one line per method probe that measured the drill's weakness
            (``ServiceFinding``, e.g. a lost replica not serving again within its deadline):
            each fails the drill with its line as a reason.
        errors: lines for tool failures (crashed action, failed figure as worded by
            :func:`figure_error_reason`, load error).
        residue: one line per fault still active after the rollbacks.
        stop_reason: why a stop condition aborted the drill, or None.
        serving: ``(before, after)`` serving replicas (None when unknown).
        replica_of: request id -> replica from the lab's own logs (engine ledger, HAProxy
            request log), for attempts that never got a response header (a hung engine).
        deadline_s: the judging deadline (s; default the client's first-token timeout).
        closed_loop: why the load had no schedule of its own (Locust's closed-loop users,
            ``chaoslib_infer.locust.control.CO_NOTE``), or None for the built-in open-loop
            client: its records' ``intended_at`` equals ``sent_at``, so the schedule lag reads
            ``unmeasured`` (never a pass), and the line is one of the verdict's notes.
        load_lost: one line per load worker lost mid-drill (which, and when it was found dead):
            the load was not what was planned, and each makes the drill inconclusive.
    """

    drill: str
    records: list[dict[str, Any]]
    figures: Mapping[str, Any]
    ground: Mapping[str, Any]
    lab_events: Sequence[Mapping[str, Any]] = ()
    ledger_measured: bool = True
    journal_status: str | None = None
    hypothesis_failures: list[tuple[str, str]] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    residue: list[str] = field(default_factory=list)
    stop_reason: str | None = None
    serving: tuple[int | None, int | None] = (None, None)
    replica_of: dict[str, str] = field(default_factory=dict)
    deadline_s: float = DEFAULT_DEADLINE_S
    closed_loop: str | None = None
    load_lost: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    """A drill's verdict: ``state``, ``reasons`` (one line each), ``rows`` (one per criterion:
    ``{"criterion", "label", "window", "value", "op", "threshold", "unit", "result", "note"}``),
    ``windows`` (``{name: {"start", "end", "requests"}}``) and ``notes``."""

    state: str
    reasons: list[str]
    rows: list[dict[str, Any]]
    windows: dict[str, dict[str, Any]]
    notes: list[str]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``summary.json`` ``verdict``)."""
        return {
            "state": self.state,
            "reasons": list(self.reasons),
            "rows": [dict(r) for r in self.rows],
            "windows": dict(self.windows),
            "notes": list(self.notes),
        }


def format_value(value: Any, unit: str | None, missing: str = "unmeasured") -> str:
    """A criterion's value or threshold as text: ``missing`` for None, seconds with ``s``,
    factors with ``x``, ratios to 4 significant digits, whole counts as integers."""
    if value is None:
        return missing
    if isinstance(value, bool):
        return "yes" if value else "no"
    v = float(value)
    if unit == "s":
        return f"{v:.3g} s"
    if unit == "ratio":
        return f"{v:.4g}"
    if unit == "x":
        return f"{v:.3g}x"
    return f"{v:.0f}" if v == int(v) else f"{v:.3g}"


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, int | float) and math.isfinite(v):
        return float(v)
    return None


def _span(records: Sequence[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    sent = [float(r["sent_at"]) for r in records if isinstance(r.get("sent_at"), int | float)]
    ends = [float(r["end_at"]) for r in records if isinstance(r.get("end_at"), int | float)]
    if not sent:
        return None, None
    return min(sent), max([*sent, *ends])


def in_window(
    records: Sequence[Mapping[str, Any]], a: float, b: float, fault_at: float | None = None
) -> list[dict[str, Any]]:
    """The attempts a window judges: sent in ``[a, b)``; with ``fault_at`` a window that ends at
    the fault (the baseline) drops attempts still in flight at it, and the window that starts at
    it (the fault window) takes them (a request the fault cut belongs to the fault)."""
    out = []
    for r in records:
        s, e = r.get("sent_at"), r.get("end_at")
        if not isinstance(s, int | float):
            continue
        ended = float(e) if isinstance(e, int | float) else float("inf")
        if fault_at is not None and b == fault_at and ended > fault_at:
            continue
        if a <= s < b or (fault_at is not None and a == fault_at and s < a < ended):
            out.append(dict(r))
    return out


def _stats(
    records: Sequence[Mapping[str, Any]], a: float | None, b: float | None
) -> dict[str, Any]:
    """Logical-request statistics (what users feel: a request that succeeded on a retry
    succeeded), with the attempts' send lag."""
    logical = logical_stats(list(records), a, b)
    attempts = window_stats(list(records), a, b)
    logical["p99_send_lag_s"] = attempts.get("p99_send_lag_s")
    logical["p99_client_lag_s"] = attempts.get("p99_client_lag_s")
    logical["attempt_requests"] = attempts.get("requests")
    return logical


def _timeouts(records: Sequence[Mapping[str, Any]], a: float, b: float) -> int:
    return sum(
        1
        for r in select(logical_outcomes(list(records)), a, b)
        if r.get("error_class") in TIMEOUT_CLASSES
    )


def _shed_p99(records: Sequence[Mapping[str, Any]], a: float, b: float) -> float | None:
    shed = [
        float(r["end_at"]) - float(r["sent_at"])
        for r in select(list(records), a, b)
        if is_shed(r) and isinstance(r.get("end_at"), int | float)
    ]
    return percentiles_s(shed, (99,))[99] if shed else None


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
) -> tuple[float | None, str | None]:
    """Health disagreement (``docs/definitions.md``, "Drill figures") of the faulted replicas in
    the fault window: the gateway's health view (HAProxy's checks in the lab's ``lb_state``
    samples: the replica's server, or its run-time detour ``<name>-...``, UP) against its
    completions (:func:`chaoslib_infer.measure.health.health_disagreement`, 1 s windows)."""
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
        return None, None
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
    result = health_disagreement(samples, records, 1.0, replica_of=facts.replica_of)
    return float(result["disagreement_s"]), None


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
) -> dict[str, tuple[float | None, str | None]]:
    """``{criterion name: (value, note)}``; a note with value None means ``n/a``."""
    fig, recs = facts.figures, facts.records
    drill = _stats(sel("drill"), None, None)
    fault = _stats(sel("fault"), None, None) if "fault" in w else {}
    after = _stats(sel("after"), None, None) if "after" in w else {}
    base = _stats(sel("baseline"), None, None) if "baseline" in w else {}
    out: dict[str, tuple[float | None, str | None]] = {
        "availability": (_num(drill.get("availability")), None),
        "availability_fault": (_num(fault.get("availability")), None),
        "timeout_rate": (_num(drill.get("timeout_rate")), None),
        "timeout_rate_fault": (_num(fault.get("timeout_rate")), None),
        "error_rate": (_num(drill.get("error_rate")), None),
        "p99_e2e_s": (_num(drill.get("p99_e2e_s")), None),
        "p99_e2e_fault_s": (_num(fault.get("p99_e2e_s")), None),
        "send_lag_p99_s": (_num(drill.get("p99_send_lag_s")), None),
        "client_lag_p99_s": (_num(drill.get("p99_client_lag_s")), None),
        "health_disagreement_s": (_num(fig.get("health_disagreement_s")), None),
    }
    if out["health_disagreement_s"][0] is None and "fault" in w:
        out["health_disagreement_s"] = _health(facts, sel("fault"), *w["fault"])
    before, end = facts.serving
    out["serving_after_vs_baseline"] = (
        (end / before, None) if before and end is not None else (None, None)
    )
    bp, ap = _num(base.get("p99_e2e_s")), _num(after.get("p99_e2e_s"))
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
        "retries",
        *GATEWAY_ONLY,
    ):
        out[name] = (_num(fig.get(name)), None)
    for name, alias in K8S_ALIASES.items():  # a cluster: the actions' own figures
        if out[name][0] is None and _num(fig.get(alias)) is not None:
            out[name] = (_num(fig.get(alias)), None)
    sustained = fig.get("interruption_sustained", fig.get("interruption_settled"))
    if "interruption_s" not in fig and tl.fault_at is not None:
        # no drill-specific figure (a cluster): the one shared computation over the records
        intr = interruption(recs, tl.fault_at)
        out["interruption_s"] = (float(intr["interruption_s"]), None)
        sustained = intr["sustained"]
    out["interruption_sustained"] = (_num(sustained) if sustained is not None else None, None)
    out["oom_kills"] = (_num(facts.ground.get("oom_kills")), None)
    for name in ("duplicate_generations", "extra_generations"):
        value = _num(
            fig.get(name, fig.get("duplicates") if name == "duplicate_generations" else None)
        )
        out[name] = (value if facts.ledger_measured else None, None)
    if "fault" in w:
        a, b = w["fault"]
        recs = sel("fault")
        a, b = float("-inf"), float("inf")
        out["timeouts_fault"] = (float(_timeouts(recs, a, b)), None)
        out["non_shed_failures_fault"] = (float(non_shed_failures(recs)), None)
        shed = _shed_p99(recs, a, b)
        out["shed_p99_s"] = (shed, None if shed is not None else "no request was shed")
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
    planned, held = _num(fig.get("planned_instances")), _num(fig.get("instances_held"))
    if planned is None and _num(fig.get("k8s_quota_replicas_after")):
        # a cluster: ready endpoints through the cut against the replicas the quota allows
        planned = _num(fig.get("k8s_quota_replicas_after"))
        held = _num(fig.get("k8s_ready_endpoints_min"))
    out["instances_held"] = ((held / planned) if planned and held is not None else None, None)
    if out["scale_out_s"][0] is None:
        wanted, serving = _num(fig.get("k8s_hpa_desired_at_s")), _num(fig.get("k8s_serving_at_s"))
        if wanted is not None and serving is not None:  # HPA desired -> new pod serving
            out["scale_out_s"] = (serving - wanted, None)
    rec = _num(fig.get("recovery_s"))
    if "recovery_s" not in fig and facts.drill == "traffic-spike" and "baseline" in w:
        # no drill figure (a cluster): the shared computation, from the end of the spike
        base_stats = window_stats(sel("baseline"))
        if base_stats.get("p99_e2e_s") is not None and tl.fault_at is not None:
            rec = recovery(facts.records, tl.fault_end or tl.fault_at, base_stats)
            fig = {**fig, "recovery_s": rec}
    out["recovery_s"] = (rec, None)
    if rec is None and "recovery_s" in fig and w.get("after"):
        # measured and never back inside the baseline bands before the load ended
        out["recovery_s"] = (None, NEVER + "back inside the baseline bands before the load ended")
    if facts.drill == "traffic-spike" and out["scale_out_s"][0] is None and "fault" in w:
        failed = sum(1 for r in sel("fault") if not r.get("ok") and not r.get("cut_off"))
        out["scale_out_s"] = (
            (None, NEVER + f"scaled out while {failed} requests failed during the spike")
            if failed
            else (None, "the spike was carried without a scale-out")
        )
    return out


def _selector(
    facts: DrillFacts, tl: Timeline, w: dict[str, tuple[float, float]]
) -> Callable[[str], list[dict[str, Any]]]:
    """The records of each named window, selected once (every criterion of a window reads the
    same list)."""
    cache: dict[str, list[dict[str, Any]]] = {}

    def sel(name: str) -> list[dict[str, Any]]:
        if name not in cache:
            a, b = w[name]
            cache[name] = in_window(facts.records, a, b, tl.fault_at)
        return cache[name]

    return sel


def _windows(facts: DrillFacts, tl: Timeline) -> dict[str, tuple[float, float]]:
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
        if end + SETTLE_AFTER_S < hi:
            w["after"] = (end + SETTLE_AFTER_S, hi)
    return w


def _window_info(
    w: dict[str, tuple[float, float]], sel: Callable[[str], list[dict[str, Any]]]
) -> dict[str, dict[str, Any]]:
    """``{window: {"start", "end", "requests" (logical)}}`` for the verdict."""
    return {
        name: {
            "start": a,
            "end": b,
            "requests": len(select(logical_outcomes(sel(name)), None, None)),
        }
        for name, (a, b) in w.items()
    }


#: Criteria on the client itself: a failure makes the drill inconclusive, not failed.
CLIENT_LAG = frozenset({"send_lag_p99_s", "client_lag_p99_s"})
#: The schedule-lag row's note under a closed-loop load (``DrillFacts.closed_loop``).
CLOSED_LOOP_LAG = "not measured: a closed-loop load has no schedule (intended_at equals sent_at)"
#: How a lost load worker (``DrillFacts.load_lost``) makes the drill inconclusive.
LOAD_LOST_PREFIX = "the load was not what was planned: "
#: How :mod:`chaoslib_infer.evidence.verdicts` words a load that could not start or run.
LOAD_ERROR_PREFIX = "the load could not run: "
#: How :func:`figure_error_reason` words a figure kind that could not be computed.
FIGURE_ERROR_PREFIX = "figures of "


def figure_error_reason(kind: str, error: str) -> str:
    """The reason line of a figure kind whose computation raised.

    Args:
        kind: the fault kind whose figures failed (``"oom-kill"``, ``"k8s-actions"``, ...).
        error: the exception as ``"Type: first line of its message"``
            (:func:`chaoslib_infer.evidence.figures.drill_figures`' ``figure_errors``).

    Returns:
        ``"figures of KIND could not be computed: ERROR"`` on one line (only the first line of a
        multi-line ``error`` is kept).
    """
    line = next(iter(str(error).strip().splitlines()), "") or "unknown error"
    return f"{FIGURE_ERROR_PREFIX}{kind} could not be computed: {line}"


#: Kubernetes drills: the actions' own figure standing for a drill figure the lab computes.
K8S_ALIASES = {
    "all_serving_s": "k8s_recovery_total_s_max",
    "replacement_serving_s": "k8s_recovery_total_s_max",
    "restart_s": "k8s_oom_restart_s",
}
#: A note that starts with this marks a point the drill never reached (never recovered, never
#: scaled out while it shed): a failure, with the note as its reason, never "unmeasured".
NEVER = "never "


def _row(c: Criterion, value: float | None, note: str | None) -> dict[str, Any]:
    if value is None and note is not None:
        result = "fail" if note.startswith(NEVER) and c.threshold is not None else "n/a"
    elif c.threshold is None:
        result = "not judged" if value is not None else "unmeasured"
    elif value is None:
        result = "unmeasured"
    else:
        result = "pass" if _OPS[c.op](value, c.threshold) else "fail"
    return {
        "criterion": c.name,
        "label": c.label,
        "window": c.window,
        "value": value,
        "op": c.op,
        "threshold": c.threshold,
        "unit": c.unit,
        "key": c.key,
        "result": result,
        "note": note,
    }


def _reason(row: Mapping[str, Any]) -> str:
    if row["value"] is None and row.get("note"):
        return f"{row['label']}: {row['note']} ({row['criterion']})"
    value = format_value(row["value"], row["unit"])
    thr = format_value(row["threshold"], row["unit"])
    fails = {"<=": ">", "<": ">=", ">=": "<", ">": "<="}[row["op"]]
    return f"{row['label']}: {value} {fails} {thr} ({row['criterion']})"


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
    crits = criteria_for(facts.drill, overrides)
    # an attempt still in flight past the deadline when the load stopped is a timeout
    facts = replace(facts, records=cut_off_timeouts(facts.records, facts.deadline_s))
    if "gateway" not in facts.figures:  # a HAProxy lab, a cluster: no gateway figures
        crits = [c for c in crits if c.name not in GATEWAY_ONLY]
    mins = {**MIN_REQUESTS, **(min_requests or {})}
    tl = timeline(facts.drill, facts.ground, facts.figures, facts.lab_events)
    w = _windows(facts, tl)
    sel = _selector(facts, tl, w)
    info = _window_info(w, sel)
    values = _values(facts, tl, w, sel) if w else {}
    rows = [_row(c, *values.get(c.name, (None, None))) for c in crits]
    notes: list[str] = [f"fault: {tl.why}"]
    if facts.closed_loop:
        for r in rows:
            if r["criterion"] == "send_lag_p99_s":  # intended_at == sent_at: nothing measured
                r.update(value=None, result="unmeasured", note=CLOSED_LOOP_LAG)
        notes.append(f"load: {facts.closed_loop}")
    notes += [f"load: {line}" for line in facts.load_lost]
    if tl.confirmed is None:
        notes.append("fault confirmation: no lab ground truth on this target")
    if w.get("fault"):
        a, b = w["fault"]
        notes.append(f"fault window: {b - a:.1f} s from injection to the return to service")
    state, reasons = _state(facts, tl, rows, info, w, mins, crits, sel)
    return Verdict(state, reasons, rows, info, notes)


def _baseline_defects(
    tl: Timeline,
    w: dict[str, tuple[float, float]],
    crits: Sequence[Criterion],
    sel: Callable[[str], list[dict[str, Any]]],
) -> list[str]:
    if "baseline" not in w or tl.fault_at is None:
        return []
    stats = _stats(sel("baseline"), None, None)
    by = {c.name: c for c in crits}
    out = []
    for name, key in (
        ("availability", "availability"),
        ("timeout_rate", "timeout_rate"),
        ("error_rate", "error_rate"),
        ("p99_e2e_s", "p99_e2e_s"),
    ):
        c = by.get(name)
        v = _num(stats.get(key))
        if c is None or c.threshold is None or v is None:
            continue
        if not _OPS[c.op](v, c.threshold):
            row = _row(c, v, None)
            row["label"] = c.label.replace("(whole drill)", "(baseline)")
            out.append(_reason(row))
    return out


def _state(
    facts: DrillFacts,
    tl: Timeline,
    rows: list[dict[str, Any]],
    info: dict[str, dict[str, Any]],
    w: dict[str, tuple[float, float]],
    mins: Mapping[str, int],
    crits: Sequence[Criterion],
    sel: Callable[[str], list[dict[str, Any]]],
) -> tuple[str, list[str]]:
    # a figure that could not be computed is listed under the states that outrank "error" too
    figure = [e for e in facts.errors if e.startswith(FIGURE_ERROR_PREFIX)]
    if facts.residue:
        residue = [f"fault left behind after the rollbacks: {r}" for r in facts.residue]
        return "failed", [*residue, *figure]
    load = [e for e in facts.errors if e.startswith(LOAD_ERROR_PREFIX)]
    if load:  # the load control interrupts the run when it cannot start: the tool failed
        return "error", list(facts.errors)
    if facts.stop_reason or facts.journal_status == "aborted":
        return "aborted", [f"stopped: {facts.stop_reason or 'the run was interrupted'}", *figure]
    if facts.errors:
        return "error", list(facts.errors)
    if not w:
        return "inconclusive", ["no request was recorded: the drill measured nothing"]
    base = _baseline_defects(tl, w, crits, sel)
    base += [line for phase, line in facts.hypothesis_failures if phase == "before"]
    if base:
        return "failed", [
            "the service did not meet its SLOs before the fault (not blamed on the fault): "
            + "; ".join(base)
        ]
    incon: list[str] = []
    if tl.confirmed is False:
        incon.append(f"fault not confirmed by ground truth: {tl.why}")
    n_base = int(info.get("baseline", {}).get("requests") or 0)
    if n_base < mins["baseline"]:
        incon.append(
            f"baseline holds {n_base} requests (< {mins['baseline']}): too few to see a defect of "
            "a few percent"
        )
    n_fault = int(info.get("fault", {}).get("requests") or 0)
    if "fault" in info and n_fault < mins["fault"]:
        incon.append(f"fault window holds {n_fault} requests (< {mins['fault']})")
    for lag in (r for r in rows if r["criterion"] in CLIENT_LAG and r["result"] == "fail"):
        incon.append(
            "the client fell behind its schedule: " + _reason(lag) + "; latencies are suspect"
        )
    incon += [LOAD_LOST_PREFIX + line for line in facts.load_lost]
    if incon:
        return "inconclusive", incon
    failed = [
        _reason(r) for r in rows if r["result"] == "fail" and r["criterion"] not in CLIENT_LAG
    ]
    for phase, line in facts.hypothesis_failures:
        if phase != "before":
            failed.append(f"steady-state hypothesis {phase} the fault deviated: {line}")
    failed += [f"during the fault: {line}" for line in facts.findings]
    if failed:
        return "failed", failed
    unmeasured = [r for r in rows if r["key"] and r["result"] == "unmeasured"]
    if unmeasured:
        return "inconclusive", [
            f"{r['label']} is unmeasured on this target ({r['criterion']}): the drill cannot "
            "answer its question"
            for r in unmeasured
        ]
    return "passed", []


def exit_code(states: Sequence[str]) -> int:
    """The game day's exit code from its drills' states (``README.md``, "Exit codes").

    Returns:
        0 every drill passed; 1 a drill failed; 2 a drill errored (none failed); 130 a drill was
        aborted (none failed or errored); 3 a drill was inconclusive (all others passed); 3 too
        when there is no drill at all (nothing was shown to work). The game day exits 1, not
        130, when the abort was a stop condition (``chaoslib_infer.gameday``, verdict
        ``STOPPED``).
    """
    if not states:
        return 3
    if "failed" in states:
        return 1
    if "error" in states:
        return 2
    if "aborted" in states:
        return 130
    if "inconclusive" in states:
        return 3
    return 0
