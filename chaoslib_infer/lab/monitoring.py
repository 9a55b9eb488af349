"""The lab's monitoring: its exposition endpoints and a Prometheus server over the whole lab.

:func:`start_monitoring` starts :class:`~chaoslib_infer.lab.exposition.LabExporter` and
Debian's Prometheus (:mod:`chaoslib_infer.lab.prometheus_server`) scraping every replica's
``/metrics``, HAProxy's exporter, the lab's cgroup memory and the load client's counters, with
three rule files: the alert table (``chaos-infer alerts``), the availability SLO's burn-rate
rules (:mod:`chaoslib_infer.lab.slo_rules`) and the team's own (``--rules``). The engines'
targets are a ``file_sd`` file rewritten whenever a replica's address changes (node loss moves
replicas to the spare node; Prometheus picks the change up within about 5 s). The lab's teardown
stops the server (its pid file); :meth:`LabMonitoring.close` stops both at once.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from chaoslib_infer.lab import prometheus_server, slo_rules
from chaoslib_infer.lab.cgroups import MemoryCgroup
from chaoslib_infer.lab.exposition import LabExporter
from chaoslib_infer.prometheus import AlertConfig, rule_file

if TYPE_CHECKING:
    from chaoslib_infer.lab.fleet import Lab

__all__ = ["LabMonitoring", "start_monitoring"]


@dataclass
class LabMonitoring:
    """A running exporter and Prometheus server.

    Attributes:
        server: the Prometheus server (``url``, ``interval_s``, ``rule_files``).
        exporter: the lab's exposition endpoints (``follow`` a drill's records).
    """

    server: prometheus_server.PrometheusServer
    exporter: LabExporter

    def close(self) -> None:
        """Stop the server and the exporter (idempotent)."""
        with contextlib.suppress(OSError):
            self.server.stop()
        self.exporter.close()


def start_monitoring(
    lab: Lab,
    *,
    interval_s: float = 1.0,
    slo: float = 0.999,
    rules: list[Path] | None = None,
    alert_config: AlertConfig | None = None,
    page: tuple[slo_rules.BurnWindow, ...] = slo_rules.PAGE_WINDOWS,
    ticket: tuple[slo_rules.BurnWindow, ...] = slo_rules.TICKET_WINDOWS,
) -> LabMonitoring:
    """Start the lab's exporter and Prometheus (see the module docstring).

    Args:
        lab: the running lab.
        interval_s: scrape and evaluation interval, seconds.
        slo: the availability SLO of the burn-rate rules.
        rules: the team's rule files (checked with promtool first).
        alert_config: inputs of the alert table's rules (default :class:`AlertConfig`).
        page, ticket: the burn-rate conditions (the workbook's by default).

    Raises:
        ConfigError: no prometheus binary, a refused rule file, the server not ready.
    """

    work = lab.state_dir / prometheus_server.PROMETHEUS_DIR / "rules"
    work.mkdir(parents=True, exist_ok=True)
    engine_sd = work.parent / "engine-targets.json"
    written: list[str] = []

    def _engine_targets() -> None:
        """Rewrite the engines' targets file when a replica moved (node loss, a spare node)."""
        with contextlib.suppress(Exception):
            reps = [(r["name"], int(r["port"])) for r in lab.meta["replicas"]]
            doc = [
                {"targets": [f"{lab.replica_host(n)}:{port}"], "labels": {"replica": n}}
                for n, port in reps
            ]
            text = json.dumps(doc, sort_keys=True)
            if written != [text]:
                tmp = engine_sd.with_suffix(".tmp")
                tmp.write_text(text, encoding="utf-8")
                tmp.replace(engine_sd)  # atomic: Prometheus never reads half a file
                written[:] = [text]

    def _cgroups() -> dict[str, MemoryCgroup]:
        _engine_targets()  # each scrape of /metrics/lab (every interval) checks the placement
        return {n: lab.replica_cgroup(n) for n in lab.replica_names()}

    _engine_targets()
    exporter = LabExporter(_cgroups)
    try:
        table = work / "alert-rules.yaml"
        table.write_text(yaml.safe_dump(rule_file(alert_config), sort_keys=False), "utf-8")
        burn = work / "slo-burn-rate.yaml"
        doc = slo_rules.burn_rate_rules(slo, page=page, ticket=ticket)
        burn.write_text(yaml.safe_dump(doc, sort_keys=False), "utf-8")
        meta = lab.meta
        jobs = {
            "lab": [f"127.0.0.1:{exporter.port}/metrics/lab"],
            "client": [f"127.0.0.1:{exporter.port}/metrics/client"],
        }
        if meta.get("haproxy_metrics_port"):
            jobs["haproxy"] = [f"127.0.0.1:{int(meta['haproxy_metrics_port'])}/metrics"]
        server = prometheus_server.start(
            lab.state_dir,
            jobs,
            [table, burn, *(rules or [])],
            interval_s,
            wait_scraped=False,
            file_sd={"engine": (engine_sd, "/metrics")},
        )
    except BaseException:
        exporter.close()
        raise
    return LabMonitoring(server, exporter)
