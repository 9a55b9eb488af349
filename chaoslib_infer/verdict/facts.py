"""The verdict's data: what a drill measured (:class:`DrillFacts`) and what the judge made of it
(:class:`Verdict`), with the verdict states and how a value reads as text.

Split out of :mod:`chaoslib_infer.verdict.judge` (issue 12), which re-exports its public names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chaoslib_infer.measure.inflight import DEFAULT_DEADLINE_S

from .policy import VerdictPolicy

__all__ = ["STATES", "DrillFacts", "Verdict", "format_value", "num"]

#: Verdict states, worst first as the game day's exit code reads them.
STATES = ("failed", "error", "aborted", "inconclusive", "passed")


@dataclass
class DrillFacts:
    """Everything a verdict reads (unix seconds).

    Attributes:
        drill: drill name.
        records: attempt records (cut-off ones included: one in flight past ``deadline_s``
            when the load stopped is judged as a timeout; in-flight timeouts added by the caller
            when judging a live run).
        figures: the drill's figures. ground: its ground truth.
        lab_events: the lab's events ([] off the lab).
        ledger_measured: whether an engine generation ledger exists for this target (else
            duplicate generations are unmeasured, never 0).
        journal_status: ``drill_status`` of the journal (``passed``, ``deviated``, ``error``,
            ``aborted``) or None.
        hypothesis_failures: one line per steady-state probe that deviated, with its phase.
        findings: one line per method probe that measured the drill's weakness
            (``ServiceFinding``, e.g. a lost replica not serving again within its deadline):
            each fails the drill with its line as a reason.
        errors: lines for tool failures (crashed action, failed figure as worded by
            :func:`figure_error_reason`, load error).
        residue: one line per fault still active after the rollbacks.
        stop_reason: why a stop condition aborted the drill, or None.
        serving: ``(before, after)`` serving replicas (None when unknown).
        replica_of: request id -> replica from the lab's own logs (engine ledger, HAProxy
            request log), for attempts that never got a response header (a hung engine).
        deadline_s: the judging deadline (s; default the client's first-token timeout).
        closed_loop: why the load had no schedule of its own (Locust's closed-loop users,
            ``chaoslib_infer.locust.control.CO_NOTE``), or None for the built-in open-loop
            client: its records' ``intended_at`` equals ``sent_at``, so the schedule lag reads
            ``unmeasured`` (never a pass), and the line is one of the verdict's notes.
        load_lost: one line per load worker lost mid-drill (which, and when it was found dead):
            the load was not what was planned, and each makes the drill inconclusive.
        warmup: why nothing succeeded during the load's warm-up, when so (``"nothing answered
            in 18 s: ..."``, :func:`chaoslib_infer.controls.load.warmup_finding`): the service
            did not meet its SLOs before the fault, a failure; None when something succeeded.
        client: the load client's own figures from its run summary
            (:func:`chaoslib_infer.load.clientside.client_figures`: ``client_cpu_share``,
            ``client_runq_wait_share``, ``load_cap``, ``load_cap_fill``, ...); they name the
            client's CPU in the reason of a client that fell behind. Empty when unknown.
        window_settings: the plan's settings of the steady-state windows' binomial test
            (:func:`chaoslib_infer.measure.binomial.plan_settings`: ``false_alarm``, ``power``,
            ``defect``); empty: the defaults (0.05, 0.9, 0.02).
    """

    drill: str
    records: list[dict[str, Any]]
    figures: Mapping[str, Any]
    ground: Mapping[str, Any]
    lab_events: Sequence[Mapping[str, Any]] = ()
    ledger_measured: bool = True
    journal_status: str | None = None
    hypothesis_failures: list[tuple[str, str]] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    residue: list[str] = field(default_factory=list)
    stop_reason: str | None = None
    serving: tuple[int | None, int | None] = (None, None)
    replica_of: dict[str, str] = field(default_factory=dict)
    deadline_s: float = DEFAULT_DEADLINE_S
    closed_loop: str | None = None
    load_lost: list[str] = field(default_factory=list)
    warmup: str | None = None
    client: Mapping[str, Any] = field(default_factory=dict)
    window_settings: Mapping[str, float] = field(default_factory=dict)
    policy: VerdictPolicy = field(default_factory=VerdictPolicy)


@dataclass
class Verdict:
    """A drill's verdict: ``state``, ``reasons`` (one line each), ``rows`` (one per criterion:
    ``{"criterion", "label", "window", "value", "op", "threshold", "unit", "result", "note"}``),
    ``windows`` (``{name: {"start", "end", "requests"}}``) and ``notes``."""

    state: str
    reasons: list[str]
    rows: list[dict[str, Any]]
    windows: dict[str, dict[str, Any]]
    notes: list[str]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``summary.json`` ``verdict``)."""
        return {
            "state": self.state,
            "reasons": list(self.reasons),
            "rows": [dict(r) for r in self.rows],
            "windows": dict(self.windows),
            "notes": list(self.notes),
        }


def format_value(value: Any, unit: str | None, missing: str = "unmeasured") -> str:
    """A criterion's value or threshold as text: ``missing`` for None, seconds with ``s``,
    factors with ``x``, ratios to 4 significant digits, whole counts as integers."""
    if value is None:
        return missing
    if isinstance(value, bool):
        return "yes" if value else "no"
    v = float(value)
    if unit == "s":
        return f"{v:.3g} s"
    if unit == "ratio":
        return f"{v:.4g}"
    if unit == "x":
        return f"{v:.3g}x"
    return f"{v:.0f}" if v == int(v) else f"{v:.3g}"


def num(v: Any) -> float | None:
    """``v`` as a finite float (a bool as 1.0 / 0.0); None for anything else."""
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, int | float) and math.isfinite(v):
        return float(v)
    return None
