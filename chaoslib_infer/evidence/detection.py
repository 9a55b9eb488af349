"""One drill's detection, read from Prometheus after the drill, judged, and shown.

:func:`drill_detection` reads the server's ``ALERTS`` and rules over the drill
(:mod:`chaoslib_infer.measure.prom_api`), turns them into figures
(:mod:`chaoslib_infer.measure.detection`), judges them (:mod:`chaoslib_infer.verdict.detection`)
and returns the ``detection`` block of the drill's ``summary.json`` entry; :func:`apply_detection`
merges its reasons into the drill's verdict and writes ``detection.json`` and a "Detection"
section into the drill's ``evidence.md``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoslib_infer.lab.slo_rules import PAGE_WINDOWS, TICKET_WINDOWS, scaled
from chaoslib_infer.measure.detection import (
    client_burn_peak,
    detection_figures,
    episodes,
    records_burn,
    rule_selectors,
)
from chaoslib_infer.measure.prom_api import (
    PrometheusAPIError,
    alert_samples,
    instant,
    rules,
)
from chaoslib_infer.verdict.detection import DetectionCriteria, judge_detection

__all__ = [
    "DETECTION_FILE",
    "DetectionPlan",
    "DetectionSetup",
    "append_detection_section",
    "apply_detection",
    "detection_line",
    "detection_markdown",
    "detection_markers",
    "detection_summary",
    "drill_detection",
    "plan_detection",
    "reapply_saved_detection",
    "scorecard_row",
    "start_detection",
]

DETECTION_FILE = "detection.json"
#: Timeline marker colours: an alert's condition first holding (pending), an alert firing.
PENDING_COLOUR = "#bcbd22"
FIRING_COLOUR = "#e377c2"
#: The workbook's page conditions as ``(short, long, factor)``.
PAGE_CONDITIONS: tuple[tuple[str, str, float], ...] = tuple(
    (w.short, w.long, w.factor) for w in PAGE_WINDOWS
)


@dataclass
class DetectionSetup:
    """How a game day reads detection.

    Attributes:
        url: the Prometheus HTTP API base.
        interval_s: its evaluation interval (seconds; one read step).
        source: ``lab`` (the lab's server, which scrapes the load client) or ``external``.
        criteria: which detection criteria are judged.
        slo: the availability SLO whose budget the page conditions burn.
        page: the page conditions ``(short, long, factor)``.
        exporter: the lab's exposition server (follows each drill's records), or None.
        judged_files: rule files whose page alerts are judged (the team's ``--rules``);
            None: every page alert the server evaluates.
    """

    url: str
    interval_s: float = 1.0
    source: str = "lab"
    criteria: DetectionCriteria = field(default_factory=DetectionCriteria)
    slo: float = 0.999
    page: tuple[tuple[str, str, float], ...] = PAGE_CONDITIONS
    exporter: Any = None
    judged_files: list[str] | None = None


def _judged(rule_list: list[dict[str, Any]], files: list[str] | None) -> set[str] | None:
    """The alerts whose pages are judged: those of ``files`` (the team's ``--rules``), or all."""
    if not files:
        return None
    wanted = {str(Path(f).resolve()) for f in files}
    return {
        str(r.get("name")) for r in rule_list if str(Path(str(r.get("file"))).resolve()) in wanted
    }


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _missing(url: str, rule_list: list[dict[str, Any]], at: float) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in rule_list:
        why = []
        for sel in rule_selectors(str(r.get("query", ""))):
            name = sel.split("{", 1)[0]
            try:
                if instant(url, f"count({sel})", at):
                    continue
                if "{" in sel and instant(url, f'count({{__name__="{name}"}})', at):
                    why.append(f"no series matches {sel} (wrong label?)")
                else:
                    why.append(f"no metric {name}")
            except PrometheusAPIError:
                continue
        if why:
            out[str(r.get("name"))] = list(dict.fromkeys(why))
    return out


def drill_detection(
    setup: DetectionSetup,
    entry: Mapping[str, Any],
    records: list[dict[str, Any]],
    kind: str | None = None,
) -> dict[str, Any]:
    """Read and judge one drill's detection.

    Args:
        setup: the server and criteria.
        entry: the drill's ``summary.json`` entry (its ``verdict.windows`` and
            ``ground_truth.fault_at`` place the baseline and the fault).
        records: the drill's attempt records (the burn rate where the server does not scrape
            the load client).
        kind: the drill's kind; ``oom-kill`` reports the early warning (the memory alert's
            condition before the kill, ``ground_truth.replica_died_at``).

    Returns:
        The ``detection`` block: the figures, ``burn_peak``, ``page_rate``, ``rows``,
        ``reasons``, or ``{"error": ...}`` when the server could not be read (never raises).
    """
    windows = (entry.get("verdict") or {}).get("windows") or {}
    ground = entry.get("ground_truth") or {}
    base = windows.get("baseline") or {}
    fault = windows.get("fault") or {}
    inj = _num(ground.get("fault_at")) or _num(fault.get("start"))
    start = _num(base.get("start")) or inj
    end_times = [_num(w.get("end")) for w in windows.values() if isinstance(w, dict)]
    end = max([t for t in end_times if t is not None], default=None)
    if inj is None or start is None or end is None:
        return {"error": "no injection time or windows: detection not read"}
    fault_end = _num(fault.get("end")) or end
    time.sleep(max(0.0, end + 2 * setup.interval_s - time.time()))  # the last evaluations
    budget = 1.0 - setup.slo
    try:
        samples = alert_samples(setup.url, start - 2 * setup.interval_s, end + setup.interval_s)
        rule_list = rules(setup.url)
        missing = _missing(setup.url, rule_list, fault_end)
        if setup.source == "lab":
            peak, reached, marginal = client_burn_peak(
                setup.url, inj, end, setup.interval_s, budget, setup.page
            )
            base_peak, base_reached, base_marginal = client_burn_peak(
                setup.url, start, inj, setup.interval_s, budget, setup.page
            )
            base_reached = base_reached or base_marginal  # within 10 %: not a false alarm
        else:  # the team's server does not scrape the load client: the fault window's burn
            peak = records_burn(records, inj, fault_end, budget)
            low = min(f for _, _, f in setup.page)
            reached = peak is not None and peak >= low
            marginal = peak is not None and 0.9 * low <= peak < 1.1 * low
            base_peak = records_burn(records, start, inj, budget)
            base_reached = base_peak is not None and base_peak >= low
    except PrometheusAPIError as exc:
        return {"error": str(exc)}
    det = detection_figures(
        episodes(samples, setup.interval_s),
        rule_list,
        drill_start=start,
        injection_at=inj,
        fault_end_at=fault_end,
        drill_end=end + setup.interval_s,
        interval_s=setup.interval_s,
        missing=missing,
    )
    page_rate = min(f for _, _, f in setup.page)
    kill = _num(ground.get("replica_died_at")) if kind == "oom-kill" else None
    rows, reasons = judge_detection(
        det,
        peak,
        reached,
        page_rate,
        setup.criteria,
        oom_kill_at_s=None if kill is None else kill - inj,
        marginal=marginal,
        judged=_judged(rule_list, setup.judged_files),
        baseline_burn=base_peak,
        baseline_reached=base_reached,
    )
    return {
        "injection_at": inj,
        "page_conditions": [list(c) for c in setup.page],
        "prometheus": setup.url,
        "source": setup.source,
        "interval_s": setup.interval_s,
        "slo": setup.slo,
        "burn_peak": None if peak is None else round(peak, 3),
        "baseline_burn_peak": None if base_peak is None else round(base_peak, 3),
        "page_rate": page_rate,
        "page_reached": reached,
        "page_marginal": marginal,
        "judged_rules": setup.judged_files or "all",
        **det,
        "rows": rows,
        "reasons": reasons,
    }


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
        f"burn peak {det.get('burn_peak')}x (baseline {det.get('baseline_burn_peak')}x); "
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


def apply_detection(entry: dict[str, Any], det: dict[str, Any], drill_dir: Path) -> None:
    """Put ``det`` into the drill's entry (``detection``, its figures ``time_to_detect_s`` /
    ``time_to_page_s``), fail the drill on its reasons (a passed or inconclusive drill becomes
    failed; error and aborted stay) and write ``detection.json`` (``chaos-infer report`` reads
    it back: :func:`reapply_saved_detection`)."""
    entry["detection"] = det
    figures = entry.setdefault("figures", {})
    figures["time_to_detect_s"] = det.get("time_to_detect_s")
    figures["time_to_page_s"] = det.get("time_to_page_s")
    reasons = list(det.get("reasons") or [])
    if reasons:
        entry["reasons"] = [*(entry.get("reasons") or []), *reasons]
        if entry.get("status") in ("passed", "inconclusive"):
            entry["status"] = "failed"
    (drill_dir / DETECTION_FILE).write_text(json.dumps(det, indent=2), encoding="utf-8")


def reapply_saved_detection(entry: dict[str, Any], drill_dir: Path) -> None:
    """A re-rendered drill (``chaos-infer report``) keeps the detection read after the drill:
    ``detection.json``, when there is one, applied again (the server is long gone)."""
    try:
        det = json.loads((drill_dir / DETECTION_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(det, dict):
        apply_detection(entry, det, drill_dir)


def append_detection_section(drill_dir: Path, entry: Mapping[str, Any]) -> None:
    """Append the "Detection" section to the drill's ``evidence.md`` (when it has one)."""
    det = entry.get("detection")
    evidence = drill_dir / "evidence.md"
    if isinstance(det, dict) and evidence.is_file():
        with evidence.open("a", encoding="utf-8") as fh:
            fh.write("\n".join(detection_markdown(det)) + "\n")


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


@dataclass
class DetectionPlan:
    """What a game day was asked for: ``prometheus`` (an external server's URL, checked), the
    team's ``rules`` (checked with promtool), ``interval_s`` of the lab's server, the judged
    ``criteria``; ``enabled`` False: no detection at all (plan ``detection: {enabled: false}``);
    ``window_scale``: the lab's burn-rate windows divided by it (1: the workbook's)."""

    prometheus: str | None = None
    rules: list[Path] = field(default_factory=list)
    interval_s: float = 1.0
    criteria: DetectionCriteria = field(default_factory=DetectionCriteria)
    enabled: bool = True
    window_scale: float = 1.0


def plan_detection(
    plan: Any, prometheus_url: str | None, rule_files: list[Path] | None
) -> DetectionPlan:
    """The game day's detection: the plan's ``detection:`` mapping (``prometheus``, ``rules``,
    ``interval_s``, ``enabled``, ``window_scale``, and the criteria ``silent_page``, ``false_page``,
    ``baseline_alarm``, ``early_warning``: on/off), overridden by ``--prometheus`` / ``--rules``.
    Checked here, before the lab comes up and before any fault.

    Raises:
        ConfigError: a malformed ``detection:``, an unreachable or non-Prometheus URL, a rule file
            promtool refuses (one line each).
    """
    import yaml

    from chaoslib_infer.errors import ConfigError
    from chaoslib_infer.lab.prometheus_server import check_rules
    from chaoslib_infer.measure.prom_api import check_prometheus

    raw: Any = {}
    try:
        doc = yaml.safe_load(Path(plan.path).read_text(encoding="utf-8")) or {}
        raw = doc.get("detection") or {} if isinstance(doc, dict) else {}
    except (OSError, yaml.YAMLError):
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{plan.path}: detection: expected a mapping")
    raw = dict(raw)
    url = prometheus_url or raw.pop("prometheus", None)
    plan_rules = raw.pop("rules", None) or []
    if isinstance(plan_rules, str):
        plan_rules = [plan_rules]
    files = list(rule_files or []) or [Path(plan.path).parent / str(p) for p in plan_rules]
    try:
        interval = float(raw.pop("interval_s", 1.0))
        if not 0.1 <= interval <= 60:
            raise ValueError("interval_s must be within 0.1..60 s")
        enabled = bool(raw.pop("enabled", True))
        scale = float(raw.pop("window_scale", 1.0))
        scaled(PAGE_WINDOWS, scale)  # refuses a scale below 1
        criteria = DetectionCriteria.from_mapping(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{plan.path}: detection: {exc}") from None
    if url is not None:
        try:
            check_prometheus(str(url))
        except PrometheusAPIError as exc:
            raise ConfigError(f"--prometheus: {exc}") from None
    if files:
        check_rules(files)
    return DetectionPlan(str(url) if url else None, files, interval, criteria, enabled, scale)


def start_detection(
    dplan: DetectionPlan,
    lab: Any,
    slo_overrides: Mapping[str, float] | None,
    progress: Any,
) -> tuple[Any, DetectionSetup | None]:
    """Start the lab's Prometheus (or use the external one) and return ``(monitoring or None,
    setup or None)``. Without the ``prometheus`` binary the game day goes on without detection
    and says so in one line.

    Raises:
        ConfigError: the server did not start (a refused rule file, not ready in time).
    """
    from chaoslib_infer.lab.monitoring import start_monitoring
    from chaoslib_infer.lab.prometheus_server import find_prometheus

    slo = float((slo_overrides or {}).get("availability", 0.999))
    if not dplan.enabled:
        return None, None
    if dplan.prometheus:
        progress(f"detection: reading ALERTS from {dplan.prometheus} after each drill")
        return None, DetectionSetup(
            dplan.prometheus, dplan.interval_s, "external", dplan.criteria, slo
        )
    if lab is None:
        return None, None
    if find_prometheus() is None:
        progress("detection: skipped, prometheus is not installed (Debian package prometheus)")
        return None, None
    page = scaled(PAGE_WINDOWS, dplan.window_scale)
    ticket = scaled(TICKET_WINDOWS, dplan.window_scale)
    mon = start_monitoring(
        lab, interval_s=dplan.interval_s, slo=slo, rules=dplan.rules, page=page, ticket=ticket
    )
    progress(
        f"detection: Prometheus at {mon.server.url}, scrape and evaluation every "
        f"{dplan.interval_s:g} s, {len(mon.server.rule_files)} rule file(s), page at "
        + " or ".join(f"{w.factor:g}x over {w.long} & {w.short}" for w in page)
    )
    setup = DetectionSetup(
        mon.server.url,
        dplan.interval_s,
        "lab",
        dplan.criteria,
        slo,
        tuple((w.short, w.long, w.factor) for w in page),
        exporter=mon.exporter,
        judged_files=[str(p) for p in dplan.rules] or None,
    )
    return mon, setup


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
    text += f"; burn peak {det.get('burn_peak')}x (pages at {_conditions(det)})"
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
