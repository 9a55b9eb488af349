"""The verdict's steady-state windows (the baseline before the fault, the window after it),
judged by the exact binomial test with their error rates stated.

Each window is judged against the whole-drill SLO criteria in force (``availability``,
``timeout_rate``, ``error_rate``, ``p99_e2e_s``: the service's SLOs) by
:func:`chaoslib_infer.measure.slo.window_test` over its logical requests: it fails an SLO only
when its count of bad requests reaches the count whose false-alarm rate at the SLO is within the
plan's bound (default 5 %), and it states for its ``n`` that false-alarm rate and its chance of
catching a 2 % defect (``docs/definitions.md``, "Windows with stated error rates"). A baseline
too short for the power target is still judged; the verdict's notes say its power, figure by
figure (:func:`power_note`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chaoslib_infer.measure.binomial import WindowTest
from chaoslib_infer.measure.metrics import e2e_ok_s, logical_outcomes, logical_stats, select
from chaoslib_infer.measure.slo import bad_word, window_test

from .criteria import Criterion
from .facts import format_value

__all__ = [
    "AFTER_RATES",
    "SLO_CRITERIA",
    "defect_reasons",
    "judge_after_rows",
    "power_note",
    "slo_tests",
    "tests_evidence",
]

#: The whole-drill criteria that are the service's SLOs, judged in the steady-state windows.
SLO_CRITERIA = ("availability", "timeout_rate", "error_rate", "p99_e2e_s")
#: Rows of the after window that judge an SLO rate (the drill's own criteria), and which.
AFTER_RATES = {"availability_after": "availability"}


def slo_tests(
    records: Sequence[Mapping[str, Any]],
    crits: Sequence[Criterion],
    settings: Mapping[str, float] | None = None,
    latency: bool = True,
) -> dict[str, tuple[Criterion, float | None, WindowTest]]:
    """The binomial test of one window against each SLO criterion that has a threshold.

    Args:
        records: the window's attempt records (each logical request once, by its first send).
        crits: the drill's criteria in force (:data:`SLO_CRITERIA` are used).
        settings: ``{"false_alarm", "power", "defect"}`` (default 0.05, 0.9, 0.02).
        latency: False leaves the P99 out (a client that fell behind: latencies suspect).

    Returns:
        ``{criterion name: (criterion, point estimate or None, WindowTest)}``.
    """
    logical = [
        r
        for r in select(logical_outcomes(list(records)), None, None)
        if r.get("final") is not False
    ]
    stats = logical_stats(list(records), None, None)
    e2e = e2e_ok_s(logical)
    by = {c.name: c for c in crits}
    out: dict[str, tuple[Criterion, float | None, WindowTest]] = {}
    for name in SLO_CRITERIA:
        c = by.get(name)
        if c is None or c.threshold is None or (name == "p99_e2e_s" and not latency):
            continue
        test = window_test(name, stats, e2e, c.threshold, settings)
        value = stats.get(name)
        if test is not None and test.n:
            out[name] = (c, float(value) if isinstance(value, int | float) else None, test)
    return out


def defect_reasons(
    tests: Mapping[str, tuple[Criterion, float | None, WindowTest]], window: str
) -> list[str]:
    """One reason line per SLO the window failed: ``"LABEL (WINDOW): VALUE < THRESHOLD; 5
    failed of 200: fails at 2 or more failed of 200 (false alarm 1.7 % at the SLO, bound
    5 %); catches a 2 % defect 91 % of the time at n=200 (CRITERION)"``."""
    out = []
    for c, value, test in tests.values():
        if test.passed:
            continue
        label = c.label.replace("(whole drill)", f"({window})")
        fails = {"<=": ">", "<": ">=", ">=": "<", ">": "<="}[c.op]
        head = f"{label}: {format_value(value, c.unit)} {fails} {format_value(c.threshold, c.unit)}"
        out.append(f"{head}; {test.statement(bad_word(c.name, c.threshold or 0.0))} ({c.name})")
    return out


def tests_evidence(
    tests: Mapping[str, tuple[Criterion, float | None, WindowTest]],
) -> dict[str, dict[str, Any]]:
    """The window's tests for its verdict entry (``windows[...]["slo_tests"]``): ``{criterion:
    WindowTest.as_dict() + {"statement"}}``."""
    return {
        name: {**test.as_dict(), "statement": test.statement(bad_word(name, c.threshold or 0.0))}
        for name, (c, _value, test) in tests.items()
    }


#: How :func:`power_note` names each judged figure.
FIGURE_NAMES = {
    "availability": "availability",
    "error_rate": "error rate",
    "timeout_rate": "timeout rate",
    "p99_e2e_s": "P99",
}


def power_note(
    window: str, tests: Mapping[str, tuple[Criterion, float | None, WindowTest]]
) -> str | None:
    """The verdict's note on a window whose tests fall short of the power target (still
    judged), one part per judged figure that does (availability, error rate, timeout rate,
    P99, each at its own allowance and ``n``): ``"baseline: 194 requests: timeout rate: fails
    at 4 or more timed out of 194 (false alarm 1.7 % at the SLO, bound 5 %); catches a 2 %
    defect only 54 % of the time at n=194; 525 needed for 90 % | P99: ..."``; None when every
    test reaches the target or the window has none. The requests are the window's logical
    requests (a P99 test's ``n``, its successful ones, is in its own part)."""
    short = [(name, c, t) for name, (c, _v, t) in tests.items() if not t.powered]
    if not short:
        return None
    n = max(t.n for _c, _v, t in tests.values())
    parts = [
        f"{FIGURE_NAMES.get(name, name)}: {t.rule(bad_word(name, c.threshold or 0.0))}; "
        f"{t.power_text()}"
        for name, c, t in short
    ]
    return f"{window}: {n} requests: " + " | ".join(parts)


def judge_after_rows(
    rows: list[dict[str, Any]],
    records: Sequence[Mapping[str, Any]],
    settings: Mapping[str, float] | None = None,
) -> None:
    """Judge in place each judged row of :data:`AFTER_RATES` (traffic-spike's
    ``availability_after``) by the binomial test over the after window's ``records`` against
    the row's own threshold: its ``result`` follows the test, and the row gains ``test`` and
    ``statement`` (:func:`chaoslib_infer.verdict.state.reason` appends the statement)."""
    stats = logical_stats(list(records), None, None)
    for row in rows:
        metric = AFTER_RATES.get(row["criterion"])
        if metric is None or row["result"] not in ("pass", "fail") or row["threshold"] is None:
            continue
        test = window_test(metric, stats, [], row["threshold"], settings)
        if test is None or not test.n:
            continue
        row["result"] = "pass" if test.passed else "fail"
        row["test"] = test.as_dict()
        row["statement"] = test.statement(bad_word(metric, row["threshold"]))
