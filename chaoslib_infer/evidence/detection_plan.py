"""How a game day sets up detection: the plan's ``detection:`` mapping and ``--prometheus`` /
``--rules`` checked before any fault, then the lab's Prometheus started (or the team's server
used). The reading and judging: :mod:`chaoslib_infer.evidence.detection`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoslib_infer.errors import ConfigError
from chaoslib_infer.evidence.detection import DetectionSetup
from chaoslib_infer.lab.slo_rules import PAGE_WINDOWS, TICKET_WINDOWS, scaled
from chaoslib_infer.measure.prom_api import PrometheusAPIError
from chaoslib_infer.verdict.detection import DetectionCriteria

__all__ = ["DetectionPlan", "plan_detection", "start_detection"]


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
    and says so in one line; so it does when the server does not start (not ready in time).
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
    try:
        mon = start_monitoring(
            lab, interval_s=dplan.interval_s, slo=slo, rules=dplan.rules, page=page, ticket=ticket
        )
    except (ConfigError, OSError) as exc:  # the drills still run; their evidence says why
        progress(f"detection: skipped, the lab's Prometheus did not start: {exc}")
        return None, None
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
