"""The comparison verdict: each key figure of a new run's drill against the last comparable runs.

Comparable runs: the same drill on the same target (:func:`~.record.target_key`) under the same
client and gateway settings (:attr:`~.record.DrillRecord.settings_hash`); the newest
:data:`LAST_N` of them, with the key figure measured.

The test, per key figure of the drill (:data:`DRILL_FIGURES`: its question's figures and its
error-budget share; :data:`KEY_FIGURES` holds each figure's unit and floor): the Student-t prediction test on
``log(value + c)`` (``c`` the figure's floor, so zeros are allowed;
:func:`~.stats.prediction_p`): "is the new run's value another draw from the population the
last runs came from?". The p-values of one drill's figures are corrected for their number with
Holm's step-down method at :data:`ALPHA`: when nothing changed and the runs are independent
log-normal draws, the chance that a drill reads ``regressed`` or ``improved`` on any figure (the
false-alarm rate) is at most 5 % (``tests/test_history_compare.py`` checks it by a seeded
simulation). A significant change smaller than the figure's floor or 10 % of the history's
median is read ``within noise`` (too small to act on). Fewer than :data:`MIN_RUNS` comparable
runs: ``not compared`` (with the number). A settings change since the previous run of the drill
on the target is named; the runs before it are not comparable, so it is never read as a
regression.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .record import DrillRecord, settings_diff
from .stats import holm, prediction_p

__all__ = [
    "ALPHA",
    "DRILL_FIGURES",
    "KEY_FIGURES",
    "LAST_N",
    "MIN_RUNS",
    "DrillComparison",
    "FigureComparison",
    "KeyFigure",
    "Past",
    "compare_drill",
]

#: family-wise false-alarm rate per drill (Holm over the drill's compared figures)
ALPHA = 0.05
#: how many of the newest comparable runs a figure is compared with
LAST_N = 6
#: the fewest comparable runs a comparison needs (2 degrees of freedom for the t test)
MIN_RUNS = 3
#: a change smaller than this share of the history's median is within noise, whatever p says
MIN_RELATIVE = 0.10


@dataclass(frozen=True)
class KeyFigure:
    """A figure the comparison judges.

    Attributes:
        name: the figure's key in ``summary.json`` drill ``figures``.
        unit: ``s``, ``count``, ``ratio`` or ``x``.
        floor: the smallest change worth reading (same unit), also the ``c`` of
            ``log(value + c)``.
        min_sd: floor of the standard deviation of the log values (a history of equal values
            is not infinitely sure): 0.05 (5 %) for times, log 1.5 for counts.
        higher_is_better: False for every figure but availability-like ones.
    """

    name: str
    unit: str
    floor: float
    min_sd: float = 0.05
    higher_is_better: bool = False


_COUNT_SD = math.log(1.5)

#: the key figures, in the order the comparison shows them; a drill is compared on those of
#: them it measured
KEY_FIGURES: tuple[KeyFigure, ...] = (
    KeyFigure("restart_s", "s", 0.25),
    KeyFigure("replacement_serving_s", "s", 0.5),
    KeyFigure("recovery_s", "s", 0.5),
    KeyFigure("interruption_s", "s", 0.25),
    KeyFigure("ejection_s", "s", 0.25),
    KeyFigure("scale_out_s", "s", 0.5),
    KeyFigure("warmup_ratio", "x", 2.0),
    KeyFigure("failed_requests", "count", 2.0, _COUNT_SD),
    KeyFigure("duplicate_generations", "count", 1.0, _COUNT_SD),
    KeyFigure("hung_requests", "count", 1.0, _COUNT_SD),
    KeyFigure("budget_share", "ratio", 0.001),
    KeyFigure("p99_e2e_during_spike_s", "s", 0.1),
    KeyFigure("p99_e2e_during_jitter_s", "s", 0.1),
    KeyFigure("p99_e2e_s", "s", 0.1),
    KeyFigure("all_serving_s", "s", 0.5),
    KeyFigure("retries", "count", 2.0, _COUNT_SD),
    KeyFigure("wasted_tokens", "count", 50.0, _COUNT_SD),
    KeyFigure("shed_requests", "count", 5.0, _COUNT_SD),
)
_BY_NAME = {k.name: k for k in KEY_FIGURES}

#: each drill's own key figures (its question's, README "What a game day does", and its cost):
#: the family Holm's correction runs over; a drill not listed is compared on every key figure
#: of :data:`KEY_FIGURES` it measured
DRILL_FIGURES: dict[str, tuple[str, ...]] = {
    "node-loss": ("interruption_s", "replacement_serving_s", "recovery_s", "failed_requests", "budget_share"),
    "oom-kill": ("restart_s", "interruption_s", "failed_requests", "budget_share"),
    "network-jitter": ("retries", "duplicate_generations", "wasted_tokens", "p99_e2e_during_jitter_s", "budget_share"),
    "traffic-spike": ("shed_requests", "scale_out_s", "p99_e2e_during_spike_s", "recovery_s", "budget_share"),
    "upstream-timeout": ("ejection_s", "hung_requests", "failed_requests", "budget_share"),
    "simultaneous-restarts": ("all_serving_s", "interruption_s", "failed_requests", "budget_share"),
    "quota-cut": ("failed_requests", "p99_e2e_s", "budget_share"),
}  # fmt: skip


@dataclass(frozen=True)
class Past:
    """One earlier run of the drill, as the comparison reads it.

    Attributes:
        run_id: the run's id in the store; started_at: ISO 8601; record: the drill's record;
        target_key: the run's target; tool: the run's tool versions.
    """

    run_id: int
    started_at: str
    target_key: str
    record: DrillRecord
    tool: dict[str, Any] = field(default_factory=dict)


@dataclass
class FigureComparison:
    """One key figure of the new run against its history.

    Attributes:
        figure, unit: the figure; value: the new run's; history: the comparable runs' values,
            oldest first; p_value: two-sided, uncorrected (None: not compared);
            threshold: the Holm threshold it was held to (None: not compared);
            reading: ``regressed``, ``improved``, ``within noise`` or ``not compared``;
            reason: one line, in the form of every other reason.
    """

    figure: str
    unit: str
    value: float
    history: list[float]
    p_value: float | None
    threshold: float | None
    reading: str
    reason: str


@dataclass
class DrillComparison:
    """A drill of the new run against its comparable history.

    Attributes:
        drill: the drill; reading: ``regressed`` when a figure regressed, else ``improved`` when
            one improved, else ``within noise``, or ``not compared`` (too few comparable runs);
        runs: the comparable runs' ids, oldest first; figures: one per key figure compared;
        settings_changed: what changed in the settings since the previous run of the drill on
            this target (empty: nothing), and since which run; versions_changed: tool versions
            that changed across the compared runs (context, not a verdict);
        reasons: the regressed and improved figures' reasons, then the settings change.
    """

    drill: str
    reading: str
    runs: list[int]
    figures: list[FigureComparison]
    settings_changed: list[str]
    changed_since: int | None
    versions_changed: list[str]
    reasons: list[str]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``summary.json`` ``history.drills``)."""
        return asdict(self)


def _fmt(value: float, unit: str) -> str:
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return f"{text} {unit}" if unit in ("s", "x") else text


def _range(values: Sequence[float], unit: str) -> str:
    lo, hi = min(values), max(values)
    if lo == hi:
        return _fmt(lo, unit)
    return f"{_fmt(lo, unit).split(' ')[0]}-{_fmt(hi, unit)}"


def _figure(
    key: KeyFigure, value: float, history: list[float]
) -> tuple[float, str, str]:  # p, direction, base reason
    logs = [math.log(h + key.floor) for h in history]
    p = prediction_p(math.log(value + key.floor), logs, key.min_sd)
    worse = (
        value < statistics.median(history)
        if key.higher_is_better
        else value > statistics.median(history)
    )
    base = (
        f"{key.name} {_fmt(value, key.unit)} vs {_range(history, key.unit)} over the last "
        f"{len(history)} runs"
    )
    return p, ("worse" if worse else "better"), base


def compare_drill(
    new: DrillRecord,
    past: Sequence[Past],
    *,
    last_n: int = LAST_N,
    min_runs: int = MIN_RUNS,
    alpha: float = ALPHA,
    new_tool: dict[str, Any] | None = None,
) -> DrillComparison:
    """Compare a new run's drill with its earlier runs.

    Args:
        new: the new run's drill.
        past: earlier runs of the same drill on the same target, any settings, oldest first
            (the store's :meth:`~.store.HistoryStore.drills`); only those with the new run's
            settings hash are compared.
        last_n, min_runs, alpha: :data:`LAST_N`, :data:`MIN_RUNS`, :data:`ALPHA`.
        new_tool: the new run's tool versions (to name version changes).

    Returns:
        The :class:`DrillComparison`.
    """
    changed: list[str] = []
    changed_since: int | None = None
    if past and past[-1].record.settings_hash != new.settings_hash:
        changed = settings_diff(past[-1].record.settings, new.settings)
        changed_since = past[-1].run_id
    same = [p for p in past if p.record.settings_hash == new.settings_hash]
    family = DRILL_FIGURES.get(new.drill, tuple(k.name for k in KEY_FIGURES))
    keys = [_BY_NAME[name] for name in family if name in new.figures]
    tests: list[tuple[KeyFigure, float, list[float], list[int]]] = []
    skipped: list[FigureComparison] = []
    used: set[int] = set()
    for key in keys:
        with_fig = [p for p in same if key.name in p.record.figures][-last_n:]
        hist = [p.record.figures[key.name] for p in with_fig]
        value = new.figures[key.name]
        if len(hist) < min_runs:
            skipped.append(
                FigureComparison(
                    key.name, key.unit, value, hist, None, None, "not compared",
                    f"{key.name} {_fmt(value, key.unit)}: {len(hist)} comparable run(s), "
                    f"{min_runs} needed",
                )
            )  # fmt: skip
            continue
        tests.append((key, value, hist, [p.run_id for p in with_fig]))
        used.update(p.run_id for p in with_fig)
    results: list[FigureComparison] = []
    if tests:
        scored = [_figure(k, v, h) for k, v, h, _ in tests]
        ps = [s[0] for s in scored]
        significant = holm(ps, alpha)
        order = sorted(range(len(ps)), key=lambda i: ps[i])
        for i, ((key, value, hist, _), (p, direction, base)) in enumerate(
            zip(tests, scored, strict=True)
        ):
            threshold = alpha / (len(ps) - order.index(i))
            step = max(key.floor, MIN_RELATIVE * abs(statistics.median(hist)))
            big = abs(value - statistics.median(hist)) >= step
            if significant[i] and big:
                reading = "regressed" if direction == "worse" else "improved"
                reason = (
                    f"{base} ({reading}: p={p:.2g} < {threshold:.2g}, t prediction test, Holm "
                    f"over {len(ps)} figures)"
                )
            else:
                reading = "within noise"
                why = (
                    f"p={p:.2g}, threshold {threshold:.2g}"
                    if not significant[i]
                    else f"a change under {_fmt(step, key.unit)}"
                )
                reason = f"{base} (within noise: {why})"
            results.append(
                FigureComparison(key.name, key.unit, value, hist, p, threshold, reading, reason)
            )
    readings = {r.reading for r in results}
    reading = (
        "regressed"
        if "regressed" in readings
        else "improved"
        if "improved" in readings
        else "within noise"
        if results
        else "not compared"
    )
    reasons = [r.reason for r in results if r.reading in ("regressed", "improved")]
    if changed:
        reasons.append(
            f"settings changed since run #{changed_since} ({'; '.join(changed[:4])}"
            + (f"; {len(changed) - 4} more" if len(changed) > 4 else "")
            + "): runs under other settings are not compared"
        )
    if reading == "not compared" and not changed:
        reasons.append(
            f"{len(same)} comparable run(s) of {new.drill}; {min_runs} needed for a comparison"
        )
    versions: list[str] = []
    if new_tool:
        compared = [p for p in same if p.run_id in used] or same[-last_n:]
        for name, ver in sorted(new_tool.items()):
            olds = sorted({str(p.tool.get(name)) for p in compared if p.tool.get(name) != ver})
            if olds and name != "kernel":
                versions.append(f"{name}: {', '.join(olds)} -> {ver}")
    return DrillComparison(
        drill=new.drill,
        reading=reading,
        runs=sorted(used),
        figures=results + skipped,
        settings_changed=changed,
        changed_since=changed_since,
        versions_changed=versions,
        reasons=reasons,
    )
