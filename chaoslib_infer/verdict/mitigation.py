"""Mitigated while the fault was on, back within the SLO after it (``docs/definitions.md``,
"Recovery"; issue 29 items 1 and 2).

A drill ends its fault after seconds; a real fault lasts until someone fixes it, so a service
that does nothing about a fault must not look cheap because the drill stopped it. Two rows
judge it in every drill, each by the exact binomial test of the windows
(:func:`chaoslib_infer.measure.slo.window_test`, through
:func:`chaoslib_infer.verdict.steady.slo_tests`):

- ``burn_rate_mitigated``: the **mitigation window**, from the drill's mitigation time after
  the injection (:func:`mitigation_time`) until the fault is over (:func:`fault_over`), with
  the fault still present. Its value is the burn rate (failed fraction / (1 - SLO),
  :func:`chaoslib_infer.measure.mitigation.burn_rate`), its threshold 1x; the window's
  availability (at the burn-rate threshold) and P99 tests decide. A service still failing there
  reads ``"not mitigated: failure rate X while the fault was on (burn rate Y; the month's budget
  gone in Z at this rate; CLASSES)"``. A fault over before its mitigation time (a replica that
  restarted in a second) leaves nothing to mitigate: ``n/a``, and the after window judges it.
- ``slo_after``: the **after window**, from the end of the fault (plus the settling time) to the
  end of the load; the SLO tests of the window (availability, error and timeout rates, P99) decide.
  Not back reads ``"not back within SLO after the fault: ..."``.

The mitigation time of each drill comes from the deadline it already judges (:data:`DEADLINES`:
the interruption, the ejection, the scale-out), so an operator who sets that deadline moves the
mitigation time with it; a drill without one takes :data:`MITIGATION_DEFAULT_S`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from chaoslib_infer.drills.traffic_spike.shed import without_shed
from chaoslib_infer.measure.binomial import WindowTest
from chaoslib_infer.measure.figures import RECOVERY_UNMEASURED
from chaoslib_infer.measure.metrics import logical_stats
from chaoslib_infer.measure.mitigation import (
    budget_gone_in_s,
    burn_rate,
    duration_words,
    failure_classes,
)
from chaoslib_infer.measure.slo import bad_word

from .criteria import MIN_REQUESTS, Criterion
from .facts import format_value, num
from .spike import SHED_BOUND
from .steady import slo_tests
from .timeline import Timeline

__all__ = [
    "BACK",
    "DEADLINES",
    "ENGINE_FAULT_MITIGATION_S",
    "FIXED_S",
    "MITIGATED",
    "MITIGATION_DEFAULT_S",
    "NOT_BACK",
    "NOT_MITIGATED",
    "RETURNS",
    "exits_in",
    "fault_over",
    "is_engine_fault",
    "judge_back",
    "judge_mitigated",
    "mitigation_note",
    "mitigation_records",
    "mitigation_time",
    "mitigation_window",
    "recovery_values",
]

#: The mitigation row and the after window's row.
MITIGATED = "burn_rate_mitigated"
BACK = "slo_after"
#: How a failed mitigation row and a failed after row start.
NOT_MITIGATED = "not mitigated"
NOT_BACK = "not back within SLO after the fault"

#: Each drill's mitigation time: the criterion whose deadline it already judges. node-loss,
#: oom-kill and simultaneous-restarts: the interruption (10 s: the gateway has ejected the lost
#: replicas and the survivors carry the load); upstream-timeout: the ejection of the frozen
#: replica (5 s); traffic-spike: the scale-out (30 s).
DEADLINES: dict[str, str] = {
    "node-loss": "interruption_s",
    "oom-kill": "interruption_s",
    "simultaneous-restarts": "interruption_s",
    "upstream-timeout": "ejection_s",
    "traffic-spike": "scale_out_s",
}
#: Drills whose fault ends when the service itself returns (the killed replicas serving again):
#: a mitigation window cut short by that return is the service's doing, never a short hold.
RETURNS = frozenset({"node-loss", "oom-kill", "simultaneous-restarts"})
#: Drills whose mitigation time is a fixed number (s): quota-cut's replicas within the quota take
#: the load as soon as the cut is done (its drain has 5 s): 5 s.
FIXED_S: dict[str, float] = {"quota-cut": 5.0}
#: The mitigation time of a drill without a deadline of its own (network-jitter, a
#: cluster's variants), or whose deadline is off: the interruption deadline every drill that
#: takes a replica away judges (10 s).
MITIGATION_DEFAULT_S = 10.0
#: An engine fault (``experiments/tools/engine-fault.yaml``): the ejection deadline of a replica
#: that answers wrong (5 s, as upstream-timeout's frozen one); the gateway's health checks see
#: a hang, a crash loop or a 5xx within a second (``observe layer7``).
ENGINE_FAULT_MITIGATION_S = 5.0


def is_engine_fault(ground: Mapping[str, Any]) -> bool:
    """Whether ``ground`` is an engine fault's ground truth (``evidence/kinds/engine_fault.py``:
    it carries ``sabotaged_request_ids``)."""
    return "sabotaged_request_ids" in ground


def mitigation_time(
    drill: str, crits: Sequence[Criterion], engine_fault: bool = False
) -> tuple[float, str]:
    """The drill's mitigation time after the injection (s) and where it comes from.

    Args:
        drill: the drill's name.
        crits: its criteria in force (overrides applied: the deadline's threshold is used).
        engine_fault: an engine fault (:data:`ENGINE_FAULT_MITIGATION_S`).

    Returns:
        ``(seconds, source)``, the source ``"the ejection deadline, ejection_s"`` or ``"the
        default"``.
    """
    if engine_fault:
        return ENGINE_FAULT_MITIGATION_S, "an engine fault's ejection deadline"
    if drill in FIXED_S:
        return FIXED_S[drill], f"{drill}'s own"
    name = DEADLINES.get(drill)
    by = {c.name: c for c in crits}
    if name is not None and name in by and by[name].threshold is not None:
        return float(by[name].threshold or 0.0), f"its deadline {name}"
    return MITIGATION_DEFAULT_S, "the default"


def fault_over(tl: Timeline, ground: Mapping[str, Any]) -> Timeline:
    """``tl`` with the end of an engine fault: its ``cleared_at`` (the method's or the
    rollback's clear), where the timeline leaves the end unknown, so the after window starts
    when the fault is over and never counts its last seconds. Other timelines unchanged (their
    end is the return to service: the replica serving again, thawed, the quota lifted, the
    spike's end)."""
    cleared = ground.get("cleared_at")
    if tl.fault_end is None and is_engine_fault(ground) and isinstance(cleared, int | float):
        if tl.fault_at is None or float(cleared) > tl.fault_at:
            return replace(tl, fault_end=float(cleared))
    return tl


def mitigation_window(
    fault_at: float | None, fault_end: float | None, last: float, mitigation_s: float
) -> tuple[float, float] | None:
    """``(start, end)`` of the mitigation window: from ``fault_at + mitigation_s`` until the
    fault is over (``fault_end``; None: the end of the data ``last``); None when the fault was
    over first (or never started)."""
    if fault_at is None:
        return None
    start = fault_at + mitigation_s
    end = fault_end if fault_end is not None else last
    return (start, end) if end > start else None


def mitigation_note(
    fault_at: float | None, fault_end: float | None, mitigation_s: float, source: str
) -> str:
    """The ``n/a`` note of a mitigation row without a window: the fault was over before its
    mitigation time."""
    over = (
        f"{fault_end - fault_at:.1f} s after the injection"
        if fault_at is not None and fault_end is not None
        else "before it"
    )
    return (
        f"the fault was over {over}, within its mitigation time of {mitigation_s:g} s "
        f"({source}): nothing left to mitigate (the after window judges the return)"
    )


def _judge_row(
    row: dict[str, Any], tests: Mapping[str, tuple[Criterion, float | None, WindowTest]]
) -> list[tuple[str, Criterion, WindowTest]]:
    """Set ``row``'s ``result``, ``test`` (the availability test) and ``statement`` from the
    window's SLO ``tests`` (with an ``availability`` entry); returns the failed tests."""
    failed = _failed_tests(tests)
    row["result"] = "fail" if failed else "pass"
    row["test"] = tests["availability"][2].as_dict()
    row["statement"] = _statement(failed) if failed else tests["availability"][2].statement()
    return failed


def _failed_tests(
    tests: Mapping[str, tuple[Criterion, float | None, WindowTest]],
) -> list[tuple[str, Criterion, WindowTest]]:
    return [(name, c, t) for name, (c, _v, t) in tests.items() if not t.passed]


def _statement(failed: Sequence[tuple[str, Criterion, WindowTest]]) -> str:
    return "; ".join(
        f"{t.statement(bad_word(name, c.threshold or 0.0))} ({name})" for name, c, t in failed
    )


def _latency_only(
    row: dict[str, Any], head: str, when: str, failed: Sequence[tuple[str, Criterion, WindowTest]]
) -> None:
    """A failed row whose availability passed (its value would read as passing): no value, the
    failed tests as its note (the reason reads ``"HEAD: NOTE (criterion)"``)."""
    row["label"] = head
    row["value"] = None
    row["note"] = (f"{when}: " if when else "") + str(row.pop("statement", ""))
    row["note"] = row["note"] or _statement(failed)


def _swap(crits: Sequence[Criterion], availability: float) -> list[Criterion]:
    """``crits`` with the availability criterion at ``availability`` (added when absent)."""
    out = [c for c in crits if c.name != "availability"]
    base = next((c for c in crits if c.name == "availability"), None)
    if base is None:
        base = Criterion("availability", "availability", ">=", availability, "ratio", "drill")
    return [replace(base, threshold=availability), *out]


def judge_mitigated(
    rows: list[dict[str, Any]],
    records: Sequence[Mapping[str, Any]],
    crits: Sequence[Criterion],
    slo_availability: float,
    settings: Mapping[str, float] | None = None,
    crash_exits: int = 0,
    latency: bool = True,
) -> None:
    """Judge in place the :data:`MITIGATED` row over the mitigation window's ``records``.

    The row (its value the burn rate, from :func:`chaoslib_infer.verdict.judge`) follows the
    window's availability test at the burn-rate threshold (1x: the SLO itself) and its P99 test;
    it gains ``test`` and ``statement``. Failed, its label becomes the reason's head: ``"not
    mitigated: failure rate X while the fault was on (burn rate Y; the month's budget gone in Z
    at this rate; CLASSES)"``, the classes named (:func:`failure_classes`, ``crash_exits`` the
    faulted replica's exits in the window). ``latency`` False (a client that fell behind)
    leaves the P99 test out: its latencies are suspect, the failures are not.
    """
    row = next((r for r in rows if r["criterion"] == MITIGATED), None)
    if row is None or row["result"] not in ("pass", "fail") or row["threshold"] is None:
        return
    allowed = 1.0 - float(row["threshold"]) * (1.0 - slo_availability)
    keep = [c for c in _swap(crits, allowed) if c.name in ("availability", "p99_e2e_s")]
    tests = slo_tests(records, keep, settings, latency)
    if "availability" not in tests:
        return
    failed = _judge_row(row, tests)
    if not failed:
        return
    if tests["availability"][2].passed:  # only the P99: slow answers, no failure to rate
        _latency_only(row, NOT_MITIGATED, "while the fault was on", failed)
        return
    stats = logical_stats(list(records), None, None)
    n, bad = int(stats.get("requests") or 0), int(stats.get("failed") or 0)
    burn = burn_rate(bad, n, slo_availability) or 0.0
    gone = budget_gone_in_s(burn)
    classes = failure_classes(records, crash_exits)
    named = ", ".join(f"{word} {k}" for word, k in classes.items())
    when = f"the month's budget gone in {duration_words(gone)} at this rate" if gone else ""
    parts = [p for p in (f"burn rate {format_value(burn, 'x')}", when, named) if p]
    rate = f"{100.0 * bad / n:.3g} %" if n else "unmeasured"
    row["label"] = (
        f"{NOT_MITIGATED}: failure rate {rate} while the fault was on ({'; '.join(parts)})"
    )


def judge_back(
    rows: list[dict[str, Any]],
    records: Sequence[Mapping[str, Any]],
    crits: Sequence[Criterion],
    settings: Mapping[str, float] | None = None,
    latency: bool = True,
) -> None:
    """Judge in place the :data:`BACK` row by the after window's SLO tests (availability at the
    row's threshold, error and timeout rates, P99: the criteria in force) over its ``records``;
    failed, its label reads :data:`NOT_BACK` and its statement names each failed test;
    ``latency`` False leaves the P99 test out (a client that fell behind)."""
    row = next((r for r in rows if r["criterion"] == BACK), None)
    if row is None or row["result"] not in ("pass", "fail") or row["threshold"] is None:
        return
    tests = slo_tests(records, _swap(crits, float(row["threshold"])), settings, latency)
    if "availability" not in tests:
        return
    failed = _judge_row(row, tests)
    if failed and tests["availability"][2].passed:  # the value shown would pass: say what failed
        _latency_only(row, NOT_BACK, "", failed)
    elif failed:
        row["label"] = NOT_BACK


def mitigation_records(
    drill: str,
    crits: Sequence[Criterion],
    w: Mapping[str, tuple[float, float]],
    sel: Callable[[str], list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """The mitigation window's records; traffic-spike's without its fast 429/503 sheds (judged
    by their own budget while the spike is on, :mod:`chaoslib_infer.verdict.spike`)."""
    if "mitigation" not in w:
        return []
    recs = sel("mitigation")
    if drill == "traffic-spike":
        bound = next((c.threshold for c in crits if c.name == SHED_BOUND), None)
        recs = without_shed(recs, bound)
    return recs


def exits_in(ground: Mapping[str, Any], a: float, b: float) -> int:
    """Exits of the faulted replicas in ``[a, b)`` (an engine fault's ``replica_exits``)."""
    return sum(
        1
        for e in ground.get("replica_exits") or []
        if isinstance(e, Mapping) and isinstance(e.get("t"), int | float) and a <= e["t"] < b
    )


def recovery_values(
    drill: str,
    tl: Timeline,
    w: Mapping[str, tuple[float, float]],
    mitigated: list[dict[str, Any]],
    sel: Callable[[str], list[dict[str, Any]]],
    mitigation: tuple[float, str],
    slo: float,
    settle_s: float,
) -> dict[str, tuple[float | None, str | None]]:
    """The values of :data:`MITIGATED` (the mitigation
    window's burn rate, judged by :func:`judge_mitigated`)
    and :data:`BACK` (the after window's availability,
    :func:`judge_back`); too few requests read unmeasured.
    ``mitigation``: ``(seconds, source)`` (:func:`mitigation_time`); ``settle_s``: how long
    after the fault's end the after window opens."""
    mitigation_s, source = mitigation
    need = MIN_REQUESTS["fault"]
    out: dict[str, tuple[float | None, str | None]] = {}
    if "mitigation" in w:
        a, b = w["mitigation"]
        stats = logical_stats(mitigated, None, None)
        n = int(stats.get("requests") or 0)
        span = f"{a - (tl.fault_at or a):g} s to {b - (tl.fault_at or a):.1f} s after the injection"
        if n < need and tl.fault_end is not None and drill in RETURNS:
            # the fault's end is the service's own return (a replica serving again): back
            # just past its mitigation time, too little left to judge
            out[MITIGATED] = (
                None,
                f"the service was back {b - (tl.fault_at or a):.1f} s after the injection, just "
                f"past its mitigation time ({span}: {n} requests, < {need}): the after window "
                "judges the return",
            )
        elif n < need:
            out[MITIGATED] = (
                None,
                f"{RECOVERY_UNMEASURED}the mitigation window ({span}; mitigation time from "
                f"{source}) holds {n} requests (< {need}): the fault was not held long enough",
            )
        else:
            out[MITIGATED] = (burn_rate(int(stats.get("failed") or 0), n, slo), None)
    elif tl.fault_at is not None:
        out[MITIGATED] = (None, mitigation_note(tl.fault_at, tl.fault_end, mitigation_s, source))
    if "after" in w:
        after = logical_stats(sel("after"), None, None)
        n = int(after.get("requests") or 0)
        out[BACK] = (
            (num(after.get("availability")), None)
            if n >= need
            else (None, f"{RECOVERY_UNMEASURED}the after window holds {n} requests (< {need})")
        )
    elif tl.fault_at is not None:
        out[BACK] = (
            None,
            f"{RECOVERY_UNMEASURED}no after window: the load ended within {settle_s:g} s "
            "of the fault's end",
        )
    return out
