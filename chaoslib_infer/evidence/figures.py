"""Compute a drill's figures (client view) and ground truth (lab view) after the run.

Client figures come from the per-attempt records; ground truth from the lab's own event log
(cgroup OOM counters, supervisor events, the engine's generation ledger). Both land in
``summary.json`` side by side so a reviewer can check one against the other.

Common figures (request counts, availability, rates, latency percentiles, duplicates) are computed
for every drill. Figures specific to a fault come from its kind's module (:func:`kind_module`: a
drill's room, ``chaoslib_infer/drills/<drill>/figures.py`` through
:data:`chaoslib_infer.drills.registry.DRILLS`, else :data:`OTHER_KINDS`) whose ``compute(ctx)``
returns ``(figures, ground_truth)`` for each fault kind logged in ``faults.jsonl``. The same module
may name the drill's timeline markers (``markers(ground, figures)``, ``LEDGER_LABELS``) and
reference lines of the replica-count plot (``replica_lines(ground, figures)``), see
:func:`timeline_markers` and :func:`replica_count_series`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from chaoslib_infer.drills.registry import DRILLS
from chaoslib_infer.evidence.kinds import engine_fault, k8s_actions, k8s_observation, k8s_scale_out
from chaoslib_infer.load.clientside import client_figures, read_run_summary
from chaoslib_infer.load.records import read_records
from chaoslib_infer.measure.faultcut import taken_pods
from chaoslib_infer.measure.figkit import (
    FAULT,
    MILESTONE,
    RECOVERY,
    REMOVED,
    STOP,
    DrillContext,
    Marker,
    mark,
    num,
    read_jsonl,
    unix_time,
)
from chaoslib_infer.measure.metrics import logical_stats, window_stats
from chaoslib_infer.measure.rerun import rerun_figures
from chaoslib_infer.measure.retryafter import provider_error_figures
from chaoslib_infer.measure.retrycost import retry_cost

__all__ = [
    "FAULT",
    "MILESTONE",
    "RECOVERY",
    "REMOVED",
    "STOP",
    "DrillContext",
    "OTHER_KINDS",
    "Marker",
    "common_figures",
    "drill_figures",
    "kind_module",
    "mark",
    "num",
    "read_jsonl",
    "replica_count_series",
    "timeline_markers",
    "unix_time",
]


def common_figures(
    records: list[dict[str, Any]],
    ledger: list[dict[str, Any]],
    faults: Sequence[Mapping[str, Any]] = (),
    lab_events: Sequence[Mapping[str, Any]] = (),
    killed: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Return the figures every drill reports, over the whole drill (all attempts).

    Keys: ``requests``, ``availability``, ``error_rate``, ``timeout_rate`` (fractions of attempted
    requests), ``p50/p95/p99/p999_e2e_s``, ``p50/p99_ttft_s`` (seconds, over successful requests,
    from the intended send), ``censored_fraction``, ``not_sent`` (requests due while the load's
    in-flight cap was full), ``errors_by_class``. When any attempt is a retry (``attempt > 1``)
    also ``p99_request_e2e_s`` (P99 per logical request, first send to final end, retries
    included; seconds) and ``request_availability`` (logical requests whose final attempt
    succeeded), :func:`chaoslib_infer.measure.metrics.logical_stats`. What retries cost, in
    every drill (:func:`chaoslib_infer.measure.retrycost.retry_cost`): ``retries``,
    ``retried_requests``, ``succeeded_after_retry`` (client), ``retry_amplification``,
    ``generations_per_attempt`` (engine ledger; None without one). The duplicate generations,
    computed once, the fault's re-runs apart
    (:func:`chaoslib_infer.measure.rerun.rerun_figures` over ``faults``, ``lab_events`` and the
    ``killed`` pods): ``rerun_generations``, ``fault_cut_generations``,
    ``fault_wasted_tokens``, ...; ``duplicate_generations`` (= ``duplicates``),
    ``extra_generations``, ``wasted_tokens`` and ``wasted_completion_tokens`` count only what
    the client or gateway caused (None, unmeasured, without a ledger line of these requests).
    When the engine answered provider errors (the ``http_error`` fault) to this drill's
    requests, also ``provider_error_answers`` and the figures of
    :func:`chaoslib_infer.measure.retryafter.provider_error_figures` (``retry_after_honoured_share``,
    ``retried_final``, ``gave_up_retryable``, ``load_amplification``, ...).
    """
    whole = window_stats(records)
    out: dict[str, Any] = {
        "requests": int(whole.get("requests") or 0),
        "availability": num(whole.get("availability")),
        "error_rate": num(whole.get("error_rate")),
        "timeout_rate": num(whole.get("timeout_rate")),
        "p50_e2e_s": num(whole.get("p50_e2e_s")),
        "p95_e2e_s": num(whole.get("p95_e2e_s")),
        "p99_e2e_s": num(whole.get("p99_e2e_s")),
        "p999_e2e_s": num(whole.get("p999_e2e_s")),
        "p50_ttft_s": num(whole.get("p50_ttft_s")),
        "p99_ttft_s": num(whole.get("p99_ttft_s")),
        "censored_fraction": num(whole.get("censored_fraction")),
        "not_sent": int(whole.get("not_sent") or 0),
        "errors_by_class": whole.get("errors_by_class") or {},
    }
    if any(int(r.get("attempt") or 1) > 1 for r in records):
        # with retries an attempt percentile censors the timed-out attempts and hides the wait
        # the user saw: give the logical request's view beside it (first send to final end)
        logical = logical_stats(records)
        out["p99_request_e2e_s"] = num(logical.get("p99_e2e_s"))
        out["request_availability"] = num(logical.get("availability"))
        out["logical_requests"] = int(logical.get("requests") or 0)
    out.update(retry_cost(records, ledger))
    # who paid for a second generation: the fault's re-runs apart from the client's and the
    # gateway's duplicates (measure/rerun.py), the one count of duplicate generations
    out.update(rerun_figures(records, ledger, faults, lab_events, killed))
    errs = provider_error_figures(ledger, {str(r.get("request_id")) for r in records})
    if errs["error_answers"]:  # the http_error engine fault answered this drill's requests
        out["provider_error_answers"] = errs.pop("error_answers")
        out["retry_after_honoured_share"] = errs.pop("retry_after_honoured_share")
        out.update(errs)
    return out


def drill_figures(
    run_dir: Path,
    lab_events: list[dict[str, Any]],
    ledger: list[dict[str, Any]],
    served_after: Callable[[str, float], float | None] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(figures, ground_truth)`` for one drill run.

    Args:
        run_dir: the drill's run folder (``records.jsonl``, ``faults.jsonl``).
        lab_events: the lab's ground-truth events (``events.jsonl``), unix-second timestamps.
        ledger: the engine's generation ledger entries (``{"t", "replica", "request_id", ...}``).
        served_after: optional callable ``(replica, after) -> float | None`` giving the unix time of
            the first request a replica served after ``after`` (lab ground truth).

    Returns:
        ``figures``: common figures, the load's own (``load.log``'s run summary,
        :func:`chaoslib_infer.load.clientside.client_figures`: ``load_cap``,
        ``load_max_in_flight``, ``load_cap_fill``, ``client_cpu_share``,
        ``client_runq_wait_share``; absent when the load left no summary) and the fault kind's
        own (e.g. ``interruption_s``, ``restart_s``); ``ground_truth``: the lab's record of the
        fault (unix seconds, counts).
        A kind whose ``compute`` raises (e.g. on the partial data of a killed run) is reported
        in ``figures["figure_errors"]`` (``{kind: "Error: first line of its message"}``) instead
        of failing all; the verdict makes such a drill ``error``
        (:func:`chaoslib_infer.evidence.verdicts.drill_verdict`).
    """
    rpath = run_dir / "records.jsonl"
    records = read_records(rpath) if rpath.exists() else []
    faults = read_jsonl(run_dir / "faults.jsonl")
    ground: dict[str, Any] = {}
    own: dict[str, Any] = {}  # the fault kinds' figures
    errors: dict[str, str] = {}
    ctx = DrillContext(run_dir, records, faults, lab_events, ledger, served_after)
    for kind in _fault_kinds(faults):
        module = kind_module(kind)
        if module is None:
            continue
        try:
            f_fig, f_ground = module.compute(ctx)
        except Exception as exc:  # partial data (a killed run): keep the other figures
            line = next(iter(str(exc).strip().splitlines()), "")  # the verdict's reason: one line
            errors[kind] = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
            continue
        own.update(f_fig)
        ground.update(f_ground)
    # the pods a Kubernetes action took (its ground truth) cut streams too: the common figures'
    # one count of duplicate generations leaves their re-runs out
    figures = common_figures(records, ledger, faults, lab_events, _killed_pods(ground))
    # the load's own run: its in-flight cap and fill, the requests not sent, its CPU
    figures.update(client_figures(read_run_summary(run_dir / "load.log")))
    figures.update(own)
    if errors:
        figures["figure_errors"] = errors
    return figures, ground


def _killed_pods(ground: dict[str, Any]) -> dict[str, float]:
    """``{pod: unix s}`` of the pods a Kubernetes action deleted or evicted (its
    ``k8s_recovery_pod <name>`` rows, ``deleted_at``) or whose container it OOM-killed
    (``k8s_oom_pod``, ``k8s_oom_killed_at``): the processes the fault took on a cluster."""
    rows = [
        {"pod": key.split(" ", 1)[1], "deleted_at": row.get("deleted_at")}
        for key, row in ground.items()
        if key.startswith("k8s_recovery_pod ") and isinstance(row, dict)
    ]
    oom = ground.get("k8s_oom_pod")
    if isinstance(oom, str) and oom:
        rows.append({"pod": oom.split(" (", 1)[0], "deleted_at": ground.get("k8s_oom_killed_at")})
    return taken_pods(rows)


#: The fault kinds that are no drill's own (their figures stay in ``evidence/kinds/``).
OTHER_KINDS: dict[str, ModuleType] = {
    "engine-fault": engine_fault,
    "k8s-actions": k8s_actions,
    "k8s-observation": k8s_observation,
    "k8s-scale-out": k8s_scale_out,
}


def kind_module(kind: str) -> ModuleType | None:
    """The figures module of fault ``kind``, or None (a kind without figures of its own).

    A drill's kind (``oom-kill`` ...) is its room's ``figures`` module, from
    :data:`chaoslib_infer.drills.registry.DRILLS`; the others come from :data:`OTHER_KINDS`.
    """
    drill = DRILLS.get(kind)
    if drill is not None:
        return drill.figures
    return OTHER_KINDS.get(kind)


def _fault_kinds(faults: list[dict[str, Any]]) -> list[str]:
    kinds: list[str] = []
    for f in faults:
        kind = str(f.get("kind") or "")
        if kind and kind not in kinds:
            kinds.append(kind)
    # the Kubernetes actions' own figures (journal outputs, fault log): kinds/k8s_actions.py;
    # always, as an action that failed before logging a fault still has its failure line
    kinds.append("k8s-actions")
    return kinds


def _merge(markers: list[Marker], within_s: float = 0.05) -> list[Marker]:
    """Sort by time; markers of one colour less than ``within_s`` apart become one ("a; b")."""
    out: list[Marker] = []
    for t, label, colour in sorted(markers, key=lambda m: m[0]):
        prev = out[-1] if out else None
        if prev is not None and prev[2] == colour and t - prev[0] < within_s:
            if label not in prev[1].split("; "):
                out[-1] = (prev[0], f"{prev[1]}; {label}", colour)
            continue
        out.append((t, label, colour))
    return out


def timeline_markers(
    faults: list[dict[str, Any]],
    lab_events: list[dict[str, Any]],
    ground: dict[str, Any],
    figures: dict[str, Any],
    start: float | None = None,
    end: float | None = None,
    stop: dict[str, Any] | None = None,
) -> list[Marker]:
    """The drill's fault and recovery markers, in time order.

    For each fault kind of the run (``faults.jsonl``): the fault ledger's own events in the
    lab's ``events.jsonl`` (``{"event": "fault", "kind", "phase": "injected" | "cleared" |
    "expired"}``, written when the lab recorded and removed the fault) inside ``[start, end]``,
    labelled by the kind module's ``LEDGER_LABELS`` (default ``("fault injected", "fault
    removed")``); without such events (a target that is not the lab) the fault log's own
    ``fault_at`` / ``cleared_at``. Then the kind's recovery points from its ground truth and
    figures (``markers(ground, figures)`` of the kind module: deaths, ejections, restarts,
    scale-out, all serving...), and the stop condition that aborted the drill, if any. Markers
    of one colour less than 50 ms apart are merged.

    Args:
        faults: the drill's fault log (``faults.jsonl``).
        lab_events: the lab's ground-truth events (unix seconds); [] without a lab.
        ground: the drill's ground truth (:func:`drill_figures`).
        figures: the drill's figures (:func:`drill_figures`).
        start: drill start (unix s; None: unbounded), bounds the ledger events.
        end: drill end (unix s; None: unbounded).
        stop: the stop condition record (``{"at", "guard", ...}``) or None.

    Returns:
        ``[(unix seconds, label, colour)]`` sorted by time.
    """
    lo = start if start is not None else float("-inf")
    hi = end if end is not None else float("inf")
    out: list[Marker] = []
    for kind in _fault_kinds(faults):
        module = kind_module(kind)
        inj_label, rm_label = getattr(module, "LEDGER_LABELS", ("fault injected", "fault removed"))
        ledger = [
            e
            for e in lab_events
            if e.get("event") == "fault"
            and e.get("kind") == kind
            and isinstance(e.get("t"), int | float)
            and lo <= float(e["t"]) <= hi
        ]
        for e in ledger:
            if e.get("phase") == "injected":
                out.append((float(e["t"]), inj_label, FAULT))
            elif e.get("phase") in ("cleared", "expired"):
                by = e.get("by")
                suffix = f" (by {by})" if by and by not in ("undo", "rollback") else ""
                if e.get("phase") == "expired":
                    suffix = " (expired: dead-man timer)"
                out.append((float(e["t"]), rm_label + suffix, REMOVED))
        if not ledger:
            for f in faults:
                if f.get("kind") != kind:
                    continue
                if f.get("phase", "injected") == "injected" and f.get("fault_at") is not None:
                    out.append((float(f["fault_at"]), inj_label, FAULT))
                if f.get("cleared_at") is not None:
                    out.append((float(f["cleared_at"]), rm_label, REMOVED))
        if module is not None and hasattr(module, "markers"):
            out.extend(module.markers(ground, figures))
    if stop and stop.get("at") is not None:
        out.append((float(stop["at"]), f"stop condition: {stop.get('guard')}", STOP))
    return _merge([m for m in out if m[0] is not None])


def replica_count_series(
    lab_events: list[dict[str, Any]], start: float, end: float
) -> dict[str, Any] | None:
    """Serving replicas over ``[start, end]`` from the lab's ground truth (a step series).

    A replica is *engine-ready* from the recorder's ``ready`` event until its next ``start`` or
    ``exit`` (a frozen process stays ready: only the load balancer sees it), *HAProxy UP* while
    the latest ``lb_state`` snapshot (the recorder's ``show stat`` samples) shows its server
    ``UP`` (or a run-time detour server ``<name>-...`` that carries its traffic, e.g.
    network-jitter's ``r0-jitter``), and *serving* when both hold. A lab whose events have no ``lb_state`` (recorded
    before the recorder sampled HAProxy) gives serving = engine-ready and ``lb_tracked`` False.
    States at ``start`` are replayed from the whole event log.

    Args:
        lab_events: the lab's ``events.jsonl`` (unix seconds).
        start: first point (unix s).
        end: last point (unix s).

    Returns:
        ``{"t": [...], "serving": [...], "ready": [...], "lb_up": [...] | None, "replicas":
        [names], "lb_tracked": bool}`` (each value holds from its ``t`` to the next; the last
        point is at ``end``), or None when the events name no replica.
    """
    events = sorted(
        (e for e in lab_events if isinstance(e.get("t"), int | float)), key=lambda e: float(e["t"])
    )
    names: set[str] = set()
    for e in events:
        if e.get("event") in ("start", "ready", "exit") and e.get("replica"):
            names.add(str(e["replica"]))
        elif e.get("event") == "lb_state" and isinstance(e.get("servers"), dict):
            names.update(str(n) for n in e["servers"] if "-" not in str(n))  # not a detour
    if not names:
        return None
    tracked = any(e.get("event") == "lb_state" for e in events)
    ready = dict.fromkeys(names, False)
    lb: dict[str, str] = {}

    def lb_up(n: str) -> bool:
        # its own server, or a run-time detour server "<n>-..." (network-jitter's shim) is UP
        return any(v == "UP" and (k == n or k.startswith(n + "-")) for k, v in lb.items())

    def counts() -> tuple[int, int, int]:
        n_ready = sum(1 for n in names if ready[n])
        n_up = sum(1 for n in names if lb_up(n))
        serving = sum(1 for n in names if ready[n] and (not tracked or lb_up(n)))
        return serving, n_ready, n_up

    def apply(e: dict[str, Any]) -> bool:
        nonlocal lb
        kind, name = e.get("event"), str(e.get("replica") or "")
        if kind == "ready" and name in ready:
            ready[name] = True
        elif kind in ("start", "exit") and name in ready:
            ready[name] = False
        elif kind == "lb_state" and isinstance(e.get("servers"), dict):
            lb = {str(k): str(v) for k, v in e["servers"].items()}
        else:
            return False
        return True

    i = 0
    while i < len(events) and float(events[i]["t"]) < start:
        apply(events[i])
        i += 1
    ts: list[float] = [start]
    rows: list[tuple[int, int, int]] = [counts()]
    for e in events[i:]:
        t = float(e["t"])
        if t > end:
            break
        if apply(e) and counts() != rows[-1]:
            ts.append(t)
            rows.append(counts())
    ts.append(end)
    rows.append(rows[-1])
    return {
        "t": ts,
        "serving": [r[0] for r in rows],
        "ready": [r[1] for r in rows],
        "lb_up": [r[2] for r in rows] if tracked else None,
        "replicas": sorted(names),
        "lb_tracked": tracked,
    }
