"""One drill's detection, read from Prometheus after the drill and judged.

:func:`drill_detection` reads the server's ``ALERTS`` and rules over the drill
(:mod:`chaoslib_infer.measure.prom_api`), turns them into figures
(:mod:`chaoslib_infer.measure.detection`), judges them (:mod:`chaoslib_infer.verdict.detection`)
and returns the ``detection`` block of the drill's ``summary.json`` entry; :func:`apply_detection`
merges its reasons into the drill's verdict and writes ``detection.json``;
:func:`append_detection_section` the "Detection" section of the drill's ``evidence.md``. How it is
shown: :mod:`chaoslib_infer.evidence.detection_view`; how a game day sets it up:
:mod:`chaoslib_infer.evidence.detection_plan`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoslib_infer.evidence.detection_view import detection_markdown
from chaoslib_infer.lab.slo_rules import PAGE_ALERT, PAGE_WINDOWS
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
    "PAGE_CONDITIONS",
    "DetectionSetup",
    "append_detection_section",
    "apply_detection",
    "drill_detection",
    "reapply_saved_detection",
]

DETECTION_FILE = "detection.json"
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
    t_read = time.monotonic()
    try:
        samples = alert_samples(setup.url, start - 2 * setup.interval_s, end + setup.interval_s)
        rule_list = rules(setup.url)
        missing = _missing(setup.url, rule_list, fault_end)
        if setup.source == "lab":
            peak, peak_factor, reached, marginal = client_burn_peak(
                setup.url, inj, end, setup.interval_s, budget, setup.page
            )
            base_peak, _, base_reached, base_marginal = client_burn_peak(
                setup.url, start, inj, setup.interval_s, budget, setup.page
            )
            base_reached = base_reached or base_marginal  # within 10 %: not a false alarm
        else:  # the team's server does not scrape the load client: the fault window's burn
            peak = records_burn(records, inj, fault_end, budget)
            low = peak_factor = min(f for _, _, f in setup.page)
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
    # the rate the burn is read against: the condition that came closest to paging
    page_rate = peak_factor or min(f for _, _, f in setup.page)
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
        own_alerts=frozenset({PAGE_ALERT}) if setup.source == "lab" else frozenset(),
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
        "read_s": round(time.monotonic() - t_read, 3),  # what reading it added to the drill
    }


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
