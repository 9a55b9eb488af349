"""How a drill's detection is shown: its evidence section, its progress line, its timeline
markers, the runbook's sentence and the scorecard's row (the figures:
:mod:`chaoslib_infer.evidence.detection`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "FIRING_COLOUR",
    "PENDING_COLOUR",
    "detection_line",
    "detection_markdown",
    "detection_markers",
    "detection_summary",
    "scorecard_row",
]

#: Timeline marker colours: an alert's condition first holding (pending), an alert firing.
PENDING_COLOUR = "#bcbd22"
FIRING_COLOUR = "#e377c2"


def _s(v: Any) -> str:
    return "-" if v is None else f"{v:+.1f} s"


def _conditions(det: Mapping[str, Any]) -> str:
    conds = det.get("page_conditions") or []
    text = " or ".join(f"{c[2]:g}x over {c[1]} & {c[0]}" for c in conds if len(c) == 3)
    return text or f"{det.get('page_rate')}x"


def detection_markdown(det: Mapping[str, Any]) -> list[str]:
    """The "Detection" section of a drill's ``evidence.md`` (Markdown lines)."""
    out = ["", "## Detection", ""]
    if det.get("error"):
        return [*out, f"Not read: {det['error']}", ""]
    out.append(
        f"Prometheus {det.get('prometheus')} ({det.get('source')}), scrape and evaluation "
        f"every {det.get('interval_s'):g} s; times from the injection. Time to detect: "
        f"{_s(det.get('time_to_detect_s'))} ({det.get('detected_by') or 'nothing fired'}); "
        f"time to page: {_s(det.get('time_to_page_s'))} ({det.get('paged_by') or 'no page'}); "
        f"burn peak {det.get('burn_peak')}x against the {det.get('page_rate')}x condition "
        f"(baseline {det.get('baseline_burn_peak')}x); "
        f"pages at {_conditions(det)}."
    )
    out += [
        "",
        "| alert | severity | phase | pending | firing | ended |",
        "|---|---|---|---|---|---|",
    ]
    for a in det.get("alerts") or []:
        out.append(
            f"| {a['alert']} | {a['severity']} | {a['phase']} | {_s(a['pending_s'])} "
            f"| {_s(a['firing_s'])} | {_s(a['ended_s'])} |"
        )
    out += ["", "| rule | for | condition held | fired | long enough | why silent |"]
    out.append("|---|---|---|---|---|---|")
    for r in det.get("rules") or []:
        enough = r.get("fault_long_enough")
        out.append(
            f"| {r['alert']} | {r['for_s']:g} s | {_s(r['condition_held_s'])} "
            f"| {_s(r['fired_s'])} | {'-' if enough is None else ('yes' if enough else 'no')} "
            f"| {r.get('why_silent', '')} |"
        )
    out += ["", "| criterion | result | note |", "|---|---|---|"]
    out += [f"| {r['criterion']} | {r['result']} | {r['note']} |" for r in det.get("rows") or []]
    return [*out, ""]


def detection_markers(det: Any) -> list[tuple[float, str, str]]:
    """Timeline markers ``(unix s, label, colour)``: each alert going pending (its condition
    first held) and firing after the drill's start."""
    if not isinstance(det, dict) or det.get("injection_at") is None:
        return []
    inj = float(det["injection_at"])
    out: list[tuple[float, str, str]] = []
    for a in det.get("alerts") or []:
        if a.get("phase") == "carried over":
            continue
        if a.get("pending_s") is not None and a.get("pending_s") != a.get("firing_s"):
            out.append((inj + a["pending_s"], f"{a['alert']} pending", PENDING_COLOUR))
        if a.get("firing_s") is not None:
            out.append((inj + a["firing_s"], f"{a['alert']} firing", FIRING_COLOUR))
    return out


def detection_summary(det: Mapping[str, Any]) -> str:
    """One sentence for the runbook's Evidence section: the alert that fired first and when, or
    the page rules that stayed silent and why."""
    if det.get("error"):
        return f"not read ({det['error']})"
    parts = []
    if det.get("detected_by"):
        parts.append(
            f"{det['detected_by']} fired first, {det['time_to_detect_s']:+.1f} s from the "
            f"injection (its condition held at {det.get('condition_held_s'):+.1f} s)"
        )
    if det.get("paged_by") and det.get("paged_by") != det.get("detected_by"):
        parts.append(f"paged by {det['paged_by']} at {det['time_to_page_s']:+.1f} s")
    if det.get("already_paging") and not det.get("paged_by"):
        parts.append(
            "already paging when the fault was injected: " + ", ".join(det["already_paging"])
        )
    elif not det.get("paged_by"):
        silent = [
            f"{r['alert']} ({r.get('why_silent', 'did not fire')})"
            for r in det.get("rules") or []
            if r.get("severity") == "page"
        ]
        parts.append("no page fired; silent page rules: " + ("; ".join(silent) or "none loaded"))
    if det.get("baseline_alarms"):
        parts.append("baseline alarms: " + ", ".join(a["alert"] for a in det["baseline_alarms"]))
    return "; ".join(parts)


def detection_line(det: Mapping[str, Any]) -> str:
    """One progress line: what fired first and when, the page, the verdict's reasons."""
    if det.get("error"):
        return f"not read ({det['error']})"
    first = det.get("detected_by")
    text = (
        f"first alert {first} firing at {det['time_to_detect_s']:+.1f} s"
        if first
        else "no alert fired after the injection"
    )
    if det.get("paged_by"):
        text += f"; paged by {det['paged_by']} at {det['time_to_page_s']:+.1f} s"
    text += (
        f"; burn peak {det.get('burn_peak')}x against the {det.get('page_rate')}x condition "
        f"(pages at {_conditions(det)})"
    )
    for reason in det.get("reasons") or []:
        text += f"; {reason}"
    return text


def scorecard_row(drills: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The scorecard's "detection" row (tier 1): the slowest time to page over the drills that
    paged; failed when a drill's detection failed (a silent page, a false page, a baseline
    alarm). None when no drill read its alerts (no row)."""
    dets = [d["detection"] for d in drills if isinstance(d.get("detection"), dict)]
    dets = [d for d in dets if not d.get("error")]
    if not dets:
        return None
    pages = [d["time_to_page_s"] for d in dets if d.get("time_to_page_s") is not None]
    failed = [r for d in dets for r in d.get("reasons") or []]
    count = {k: sum(1 for r in failed if k in r) for k in ("silent page", "false page", "baseline")}
    expected = sum(1 for d in dets if d.get("page_reached"))
    already = sum(1 for d in dets if d.get("already_paging") and d.get("time_to_page_s") is None)
    note = (
        f"{len(pages)} of {len(dets)} drills paged, {already} found the page already up "
        f"({expected} burned at a page rate); "
        f"silent pages {count['silent page']}, false pages {count['false page']}, "
        f"baseline alarms {count['baseline']}; slowest time to page shown"
    )
    return {
        "metric": "detection",
        "value": max(pages) if pages else None,
        "unit": "s",
        "reference": "pages when the budget burns at a page rate, never otherwise",
        "passed": not failed,
        "note": note,
    }
