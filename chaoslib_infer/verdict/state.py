"""The verdict's state and its reasons: each criterion's judged row, the order of precedence of
the states (:mod:`chaoslib_infer.verdict.judge`, "States"), and the game day's exit code.

Split out of :mod:`chaoslib_infer.verdict.judge` (issue 12), which re-exports its public names.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chaoslib_infer.measure.figures import RECOVERY_UNMEASURED
from chaoslib_infer.measure.metrics import logical_stats, window_stats

from .confirm import MISSED
from .criteria import Criterion
from .facts import DrillFacts, format_value, num
from .steady import defect_reasons, slo_tests
from .timeline import Timeline

__all__ = [
    "ALSO_FAILED",
    "ALSO_INCONCLUSIVE",
    "BEFORE_FAULT",
    "CLIENT_INDEPENDENT",
    "CLIENT_LAG",
    "CLIENT_VIEW",
    "FIGURE_ERROR_PREFIX",
    "LOAD_ERROR_PREFIX",
    "LOAD_LOST_PREFIX",
    "NEVER",
    "OPS",
    "SCHEDULE_DEPENDENT",
    "WARMUP_LAG",
    "baseline_defects",
    "client_bound",
    "client_lag_rows",
    "client_reason",
    "decide_state",
    "exit_code",
    "figure_error_reason",
    "judged_row",
    "reason",
    "request_stats",
]

OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
}

#: Criteria on the client itself: a failure makes the drill inconclusive, not failed.
CLIENT_LAG = frozenset({"send_lag_p99_s", "client_lag_p99_s"})
#: Criteria whose failure is evidence that does not depend on the client's schedule (timeouts,
#: 5xx and every other failed answer, wrong or empty content, requests the service held past the
#: cap, duplicates, a service that ended smaller, and the rows measured from the lab's ground
#: truth: a replica's restart, its replacement serving, every replica serving again, the
#: gateway's health view against the replica's completions, the longest wait the service held a
#: request, the replicas that served during a quota cut): they fail the drill even when another
#: reason would make it inconclusive, which is then listed beside (:data:`ALSO_INCONCLUSIVE`).
#: Latency and the figures timed from it (recovery, interruption, scale-out) are not among them:
#: a client that fell behind makes them suspect. With a client that fell behind, the rates are
#: judged without the requests it did not send, and without its timeouts when its lag is large
#: against the deadline (:mod:`chaoslib_infer.verdict.client`), so they hold the service's
#: failures only.
CLIENT_INDEPENDENT = frozenset(
    {
        "restart_s",
        "replacement_serving_s",
        "all_serving_s",
        "health_disagreement_s",
        "max_wait_s",
        "instances_held",
        "availability",
        "availability_fault",
        "availability_after",
        # the mitigation and after windows' failures (verdict/mitigation.py), counted like
        # availability_after's
        "burn_rate_mitigated",
        "slo_after",
        "budget_share",
        "shed_share_fault",
        "timeout_rate",
        "timeout_rate_fault",
        "error_rate",
        "not_sent",
        "timeouts_fault",
        "non_shed_failures_fault",
        "duplicate_generations",
        "extra_generations",
        "wasted_tokens",
        "retry_amplification",
        "retry_after_honoured",
        "retried_final",
        "load_amplification",
        "hung_requests",
        "streams_cut_200",
        "serving_after_vs_baseline",
    }
)
#: The SLO metrics a steady-state probe measures from the client's side (``slo_check``'s
#: ``metric``: its line in :attr:`DrillFacts.hypothesis_failures` reads ``"NAME: METRIC =
#: VALUE ..."``): with a client that fell behind, such a deviation measured the client too.
CLIENT_VIEW = (
    "availability",
    "error_rate",
    "timeout_rate",
    "p50_e2e_s",
    "p95_e2e_s",
    "p99_e2e_s",
)
#: How a failed row that depends on the client's schedule reads among the reasons of a drill
#: that something else makes inconclusive: listed, never dropped, but not judged against the
#: service.
SCHEDULE_DEPENDENT = (
    " (timed by the client: not judged against the service while the drill is inconclusive)"
)
#: How a reason reads after a defect before the fault (:data:`BEFORE_FAULT`): listed, never
#: hidden by it, and never blamed on the fault alone.
ALSO_FAILED = "also failed (the defect before the fault may account for it): "
#: How a client that fell behind in the load's warm-up starts its inconclusive reason.
WARMUP_LAG = "the client fell behind its schedule before the fault"
#: How an inconclusive reason reads beside the reasons of a failed drill.
ALSO_INCONCLUSIVE = "also inconclusive: "
#: How a defect present before the fault starts its reason (never blamed on the fault).
BEFORE_FAULT = "the service did not meet its SLOs before the fault"
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


#: A note that starts with this marks a point the drill never reached (never recovered, never
#: scaled out while it shed): a failure, with the note as its reason, never "unmeasured".
NEVER = "never "


def request_stats(
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


def judged_row(c: Criterion, value: float | None, note: str | None) -> dict[str, Any]:
    """One criterion's row of the verdict (:class:`~chaoslib_infer.verdict.facts.Verdict`
    ``rows``): ``value`` None with a ``note`` reads ``n/a`` (the event the criterion is about did
    not happen), ``fail`` when the note starts with :data:`NEVER` and the criterion has a
    threshold, or ``unmeasured`` when it starts with ``"unmeasured: "`` (the data ended before the
    figure could be shown, :data:`~chaoslib_infer.measure.figures.RECOVERY_UNMEASURED`). A
    criterion with a ``fix`` carries it in the row (:func:`reason` names it)."""
    if value is None and note is not None:
        if note.startswith(RECOVERY_UNMEASURED):
            result = "unmeasured"
        elif note.startswith(NEVER) and c.threshold is not None:
            result = "fail"
        else:
            result = "n/a"
    elif c.threshold is None:
        result = "not judged" if value is not None else "unmeasured"
    elif value is None:
        result = "unmeasured"
    else:
        result = "pass" if OPS[c.op](value, c.threshold) else "fail"
    row: dict[str, Any] = {
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
    if c.fix:
        row["fix"] = c.fix
    return row


def reason(row: Mapping[str, Any]) -> str:
    """A failed row as one reason line: ``"LABEL: VALUE OP THRESHOLD (CRITERION)"`` (``OP`` the
    broken side; a row judged by a window's binomial test, :mod:`chaoslib_infer.verdict.steady`,
    adds ``"; STATEMENT"`` before the criterion: its count, false-alarm rate and power), or
    ``"LABEL: NOTE
    (CRITERION)"`` for a row with a note and no value; a row whose criterion names a fix adds
    ``"; fix: FIX"`` before the criterion; either followed by ``"; BLAME: WHO
    (why)"`` when the row says who caused it (``blame``, :mod:`chaoslib_infer.verdict.blame`)."""
    blame = f"; BLAME: {row['blame']}" if row.get("blame") else ""
    fix = f"; fix: {row['fix']}" if row.get("fix") else ""
    if row["value"] is None and row.get("note"):
        return f"{row['label']}: {row['note']}{fix} ({row['criterion']}){blame}"
    value = format_value(row["value"], row["unit"])
    thr = format_value(row["threshold"], row["unit"])
    fails = {"<=": ">", "<": ">=", ">=": "<", ">": "<="}[row["op"]]
    statement = row.get("statement")  # a steady-state window's binomial test (verdict/steady.py)
    tested = f"; {statement}" if statement else ""
    return f"{row['label']}: {value} {fails} {thr}{tested}{fix} ({row['criterion']}){blame}"


def baseline_defects(
    tl: Timeline,
    w: dict[str, tuple[float, float]],
    crits: Sequence[Criterion],
    sel: Callable[[str], list[dict[str, Any]]],
    latency: bool = True,
    settings: Mapping[str, float] | None = None,
) -> list[str]:
    """One reason line per whole-drill SLO criterion (availability, timeout and error rates,
    p99) the baseline window (``w["baseline"]``, records through ``sel``) already breaks, by
    the exact binomial test with its error rates stated (:mod:`chaoslib_infer.verdict.steady`;
    ``settings``: the plan's false-alarm bound, power target and defect); the p99 only with
    ``latency`` (False: the client fell behind, its latencies are suspect)."""
    if "baseline" not in w or tl.fault_at is None:
        return []
    return defect_reasons(slo_tests(sel("baseline"), crits, settings, latency), "baseline")


def client_bound(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the client itself was the bottleneck: a row of :data:`CLIENT_LAG` (its own lag
    from the schedule to the send, or from the kernel's receive stamp to its handling) failed."""
    return any(r["criterion"] in CLIENT_LAG and r["result"] == "fail" for r in rows)


def client_reason(row: Mapping[str, Any], client: Mapping[str, Any]) -> str:
    """The inconclusive reason of a failed :data:`CLIENT_LAG` row: which of the client's own lags
    it was, and its CPU when the load's run summary gave it.

    Args:
        row: the failed row (``send_lag_p99_s``: it sent late; ``client_lag_p99_s``: it read
            late). client: :attr:`DrillFacts.client` (``client_cpu_share``,
            ``client_runq_wait_share``: fractions of the run).

    Returns:
        ``"the client fell behind its schedule (it sent late | it read late): <row's reason>[;
        its CPU: busy N % of one core, waiting for a CPU M % of the run]; latencies are
        suspect"``.
    """
    which = "it sent late" if row["criterion"] == "send_lag_p99_s" else "it read late"
    cpu = []
    busy, waited = num(client.get("client_cpu_share")), num(client.get("client_runq_wait_share"))
    if busy is not None:
        cpu.append(f"busy {busy:.0%} of one core")
    if waited is not None:
        cpu.append(f"waiting for a CPU {waited:.0%} of the run")
    tail = f"; its CPU: {', '.join(cpu)}" if cpu else ""
    return (
        f"the client fell behind its schedule ({which}): {reason(row)}{tail}; latencies are suspect"
    )


def _says_a_failed_row(line: str, failing: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a hypothesis probe's failure ``line`` only repeats a row already failed (it names
    the row's criterion as ``(NAME)`` or ``NAME = VALUE``): its reason is listed once."""
    return any(f"({r['criterion']})" in line or f"{r['criterion']} = " in line for r in failing)


def _client_view(line: str) -> bool:
    """Whether a deviated probe's ``line`` is an SLO the client measured (:data:`CLIENT_VIEW`)."""
    return any(f": {m} = " in line for m in CLIENT_VIEW)


def client_lag_rows(
    records: Sequence[Mapping[str, Any]], crits: Sequence[Criterion]
) -> list[dict[str, Any]]:
    """The :data:`CLIENT_LAG` criteria the client's own lag broke over ``records`` (one window:
    the baseline, that is the load's warm-up and the hypothesis before the fault, or an SLO
    probe's look-back window), as failed rows.

    Args:
        records: the window's attempt records. crits: the drill's criteria (the lag thresholds
            in force: ``send_lag_p99_s``, ``client_lag_p99_s``; one set to None is not judged).

    Returns:
        One :func:`judged_row` per broken lag criterion (its P99 over the window's attempts, s);
        [] when the client kept up there (or its lag is unmeasured: no kernel stamps).
    """
    if not records:
        return []
    stats = request_stats(records, None, None)
    keys = {"send_lag_p99_s": "p99_send_lag_s", "client_lag_p99_s": "p99_client_lag_s"}
    rows = []
    for c in crits:
        if c.name in keys and c.threshold is not None:
            row = judged_row(c, num(stats.get(keys[c.name])), None)
            if row["result"] == "fail":
                rows.append(row)
    return rows


def _without_not_sent(
    sel: Callable[[str], list[dict[str, Any]]],
) -> Callable[[str], list[dict[str, Any]]]:
    """``sel`` without the requests the client did not send (its own, when it fell behind)."""

    def kept(name: str) -> list[dict[str, Any]]:
        return [r for r in sel(name) if not r.get("not_sent")]

    return kept


def _warmup_reason(
    lag: Sequence[Mapping[str, Any]], lines: Sequence[str], client: Mapping[str, Any]
) -> str:
    """The inconclusive reason of a hypothesis before the fault that deviated on what a client
    that fell behind in the warm-up measured: the client named first (its lag, its CPU), then
    the deviations, kept as evidence."""
    which = client_reason(lag[0], client).removeprefix("the client fell behind its schedule ")
    more = "".join(f"; {reason(r)}" for r in lag[1:])
    return (
        f"{WARMUP_LAG} {which.removesuffix('; latencies are suspect')}{more}: the steady-state "
        "hypothesis before the fault measured the client, not only the service, and is not "
        "blamed on it: " + "; ".join(lines)
    )


def _after_defect(before: Sequence[str], lines: Sequence[str]) -> list[str]:
    """``lines`` as they follow the reasons of a defect before the fault (``before``): each
    :data:`ALSO_FAILED`; unchanged when there is none."""
    return [ALSO_FAILED + line if before else line for line in lines]


def _fault_reasons(
    tl: Timeline, info: Mapping[str, Mapping[str, Any]], mins: Mapping[str, int]
) -> list[str]:
    """The inconclusive reasons of the fault itself: not confirmed by ground truth (or not felt
    by the traffic), a baseline or a fault window with too few requests."""
    out: list[str] = []
    if tl.confirmed is False:
        missed = tl.why.startswith(MISSED)  # the traffic did not feel it (verdict/confirm.py)
        out.append(tl.why if missed else f"fault not confirmed by ground truth: {tl.why}")
    n_base = int(info.get("baseline", {}).get("requests") or 0)
    if n_base < mins["baseline"]:
        out.append(
            f"baseline holds {n_base} requests (< {mins['baseline']}): too few to see a defect of "
            "a few percent"
        )
    n_fault = int(info.get("fault", {}).get("requests") or 0)
    if "fault" in info and n_fault < mins["fault"]:
        out.append(f"fault window holds {n_fault} requests (< {mins['fault']})")
    return out


def decide_state(
    facts: DrillFacts,
    tl: Timeline,
    rows: list[dict[str, Any]],
    info: dict[str, dict[str, Any]],
    w: dict[str, tuple[float, float]],
    mins: Mapping[str, int],
    crits: Sequence[Criterion],
    sel: Callable[[str], list[dict[str, Any]]],
) -> tuple[str, list[str]]:
    """The verdict's ``(state, reasons)`` in the states' order of precedence
    (:mod:`chaoslib_infer.verdict.judge`): ``rows`` the judged rows, ``info`` and ``w`` the
    windows (``{name: {"start", "end", "requests"}}``, ``{name: (start, end)}``), ``mins`` the
    minimum requests per window, ``sel`` each window's records.

    Failed outranks inconclusive when its evidence does not depend on the client's schedule:
    a defect before the fault (listed first, never blamed on the fault, never instead of the
    rest, which then reads :data:`ALSO_FAILED`), every failed :data:`CLIENT_INDEPENDENT` row,
    every deviated hypothesis after the fault (unless the client fell behind and the probe
    measured an SLO from its side, :data:`CLIENT_VIEW`) and the method's findings, all of them
    listed. The inconclusive reasons then follow, each as ``"also inconclusive: ..."``, and with
    them the failed rows that depend on the client's schedule (:data:`SCHEDULE_DEPENDENT`) and
    the client-side deviations of a client that fell behind: evidence kept, not judged against
    the service.
    A hypothesis before the fault that deviated on what a client lagging in the warm-up
    measured (:func:`client_lag_rows` over the baseline) is inconclusive naming the client
    (:data:`WARMUP_LAG`), not a defect of the service.
    """
    # a figure that could not be computed is listed under the states that outrank "error" too
    figure = [e for e in facts.errors if e.startswith(FIGURE_ERROR_PREFIX)]
    residue = [f"fault left behind after the rollbacks: {r}" for r in facts.residue]
    stopped = f"stopped: {facts.stop_reason or 'the run was interrupted'}"
    # the load control interrupts the run when it cannot start: the tool failed, not the user
    load = [e for e in facts.errors if e.startswith(LOAD_ERROR_PREFIX)]
    if facts.journal_status == "aborted" and not load:  # Ctrl-C, SIGTERM: the game day stops
        # (exit 130), a fault the rollbacks left behind listed with it, never hidden
        return "aborted", [stopped, *residue, *figure]
    if residue:
        return "failed", [*residue, *figure]
    if load:
        return "error", list(facts.errors)
    if facts.stop_reason:
        return "aborted", [stopped, *figure]
    if facts.errors:
        return "error", list(facts.errors)
    if not w and not facts.warmup:
        return "inconclusive", ["no request was recorded: the drill measured nothing"]
    lagging = client_bound(rows)
    # the client's own shortfalls: they void the schedule-dependent figures
    client = [
        client_reason(r, facts.client)
        for r in rows
        if r["criterion"] in CLIENT_LAG and r["result"] == "fail"
    ]
    client += [LOAD_LOST_PREFIX + line for line in facts.load_lost]
    # before the fault: a defect of the service is listed first; what a client lagging in the
    # warm-up measured is its own (inconclusive, naming it)
    before = [f"{BEFORE_FAULT} ({facts.warmup})"] if facts.warmup else []
    # the warm-up: the baseline window, or every record when the method never ran (no fault)
    warmup = "baseline" if "baseline" in w else ("drill" if tl.fault_at is None else None)
    warm = client_lag_rows(sel(warmup), crits) if warmup in w else []
    late = bool(lagging or warm)
    # the judge's own baseline test, without the client's outcomes when it fell behind there
    # (with ``lagging`` the records were already judged without them: verdict/client.py)
    base_sel = _without_not_sent(sel) if warm and not lagging else sel
    base = baseline_defects(tl, w, crits, base_sel, not late, facts.window_settings) if w else []
    probe_before = [line for phase, line in facts.hypothesis_failures if phase == "before"]
    measured_client = [line for line in probe_before if warm and _client_view(line)]
    base += [line for line in probe_before if line not in measured_client]
    if base:
        before.append(f"{BEFORE_FAULT} (not blamed on the fault): " + "; ".join(base))
    incon: list[str] = []
    if measured_client:
        incon.append(_warmup_reason(warm, measured_client, facts.client))
    # a hypothesis before the fault that deviated stops the run before the method: no fault, and
    # no window of it to count, is then the deviation's consequence, not another reason
    if tl.fault_at is not None or not (before or measured_client):
        incon += _fault_reasons(tl, info, mins)
    incon += client
    findings = [f"during the fault: {line}" for line in facts.findings]
    failing = [r for r in rows if r["result"] == "fail" and r["criterion"] not in CLIENT_LAG]
    after = [
        (
            f"steady-state hypothesis {phase} the fault deviated: {line}",
            lagging and _client_view(line),
        )
        for phase, line in facts.hypothesis_failures
        if phase != "before" and not _says_a_failed_row(line, failing)
    ]
    if incon:
        hard = [reason(r) for r in failing if r["criterion"] in CLIENT_INDEPENDENT]
        hard += [line for line, client_side in after if not client_side]
        incon += [
            reason(r) + SCHEDULE_DEPENDENT
            for r in failing
            if r["criterion"] not in CLIENT_INDEPENDENT
        ]
        incon += [line for line, client_side in after if client_side]
        failed = [*before, *_after_defect(before, [*hard, *findings])]
        if failed:
            return "failed", [*failed, *(ALSO_INCONCLUSIVE + line for line in incon)]
        return "inconclusive", incon
    rest = [*(reason(r) for r in failing), *(line for line, _ in after), *findings]
    failed = [*before, *_after_defect(before, rest)]
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
