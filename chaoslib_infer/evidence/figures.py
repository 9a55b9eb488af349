"""Compute a drill's figures (client view) and ground truth (lab view) after the run.

Client figures come from the per-attempt records; ground truth from the lab's own event log
(cgroup OOM counters, supervisor events, the engine's generation ledger). Both land in
``summary.json`` side by side so a reviewer can check one against the other.

Common figures (request counts, availability, rates, latency percentiles, duplicates) are computed
for every drill. Figures specific to a fault come from the module
``chaoslib_infer.evidence.kinds.<kind>`` (``oom-kill`` -> ``oom_kill``) whose ``compute(ctx)``
returns ``(figures, ground_truth)`` for each fault kind logged in ``faults.jsonl``.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoslib_infer.load.records import read_records
from chaoslib_infer.measure import figures as mfig
from chaoslib_infer.measure.metrics import window_stats

__all__ = ["DrillContext", "common_figures", "drill_figures", "num", "read_jsonl"]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL file, skipping unparsable lines (a writer killed mid-line). Missing file: []."""
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def num(value: Any) -> float | None:
    """Return ``value`` as a float, or ``None``."""
    return None if value is None else float(value)


@dataclass
class DrillContext:
    """Everything a per-fault figure function may read (all times unix seconds)."""

    run_dir: Path
    records: list[dict[str, Any]]
    faults: list[dict[str, Any]]
    lab_events: list[dict[str, Any]]
    ledger: list[dict[str, Any]]
    served_after: Callable[[str, float], float | None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def last_fault(self, kind: str) -> dict[str, Any] | None:
        """Return the last logged fault of ``kind`` (e.g. ``"oom-kill"``), or ``None``."""
        return next((f for f in reversed(self.faults) if f.get("kind") == kind), None)

    def records_before(self, t: float) -> list[dict[str, Any]]:
        """Records sent before ``t`` (the steady state before a fault)."""
        return [r for r in self.records if float(r.get("sent_at") or 0.0) < t]


def common_figures(records: list[dict[str, Any]], ledger: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the figures every drill reports, over the whole drill (all attempts).

    Keys: ``requests``, ``availability``, ``error_rate``, ``timeout_rate`` (fractions of attempted
    requests), ``p50/p95/p99/p999_e2e_s``, ``p50/p99_ttft_s`` (seconds, over successful requests),
    ``censored_fraction``, ``errors_by_class``, ``duplicates`` (logical requests the engine generated
    more than once, from the generation ledger).
    """
    whole = window_stats(records)
    return {
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
        "errors_by_class": whole.get("errors_by_class") or {},
        "duplicates": int(mfig.duplicates(records, ledger)),
    }


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
        ``figures``: common figures plus the fault kind's own (e.g. ``interruption_s``,
        ``restart_s``); ``ground_truth``: the lab's record of the fault (unix seconds, counts).
        A kind whose ``compute`` raises (e.g. on the partial data of a killed run) is reported
        in ``figures["figure_errors"]`` (``{kind: "Error: message"}``) instead of failing all.
    """
    rpath = run_dir / "records.jsonl"
    records = read_records(rpath) if rpath.exists() else []
    faults = read_jsonl(run_dir / "faults.jsonl")
    figures = common_figures(records, ledger)
    ground: dict[str, Any] = {}
    ctx = DrillContext(run_dir, records, faults, lab_events, ledger, served_after)
    kinds: list[str] = []
    for f in faults:
        kind = str(f.get("kind") or "")
        if kind and kind not in kinds:
            kinds.append(kind)
    for kind in kinds:
        try:
            module = importlib.import_module(
                f"chaoslib_infer.evidence.kinds.{kind.replace('-', '_')}"
            )
        except ModuleNotFoundError:
            continue
        try:
            f_fig, f_ground = module.compute(ctx)
        except Exception as exc:  # partial data (a killed run): keep the other figures
            figures.setdefault("figure_errors", {})[kind] = f"{type(exc).__name__}: {exc}"
            continue
        figures.update(f_fig)
        ground.update(f_ground)
    return figures, ground
