"""Recording a run in the history store and comparing its drills with their history: what a
game day, a drill run, a certification and ``chaos-infer history import`` call.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .compare import MIN_RUNS, DrillComparison, Past, compare_drill
from .record import RunRecord, record_from_summary, unix_of
from .render import trend_doc
from .store import HistoryStore, StoredDrill, open_store, shown_url

__all__ = ["TREND_RUNS", "compare_run", "past_of", "record_summary"]

#: how many runs of a drill the game day's trend shows (this one included)
TREND_RUNS = 10


def past_of(stored: list[StoredDrill]) -> list[Past]:
    """The store's drills as the comparison reads them (same order)."""
    return [Past(s.run_id, s.started_at, s.target_key, s.drill, s.tool) for s in stored]


def compare_run(store: HistoryStore, run: RunRecord) -> dict[str, DrillComparison]:
    """Each drill of ``run`` against the runs of the same drill on the same target that started
    before it (:func:`~.compare.compare_drill`); ``{drill: comparison}``."""
    before = unix_of(run.started_at)
    out = {}
    for d in run.drills:
        past = store.drills(drill=d.drill, target_key=run.target_key, before_unix=before)
        out[d.drill] = compare_drill(d, past_of(past), new_tool=run.tool)
    return out


def record_summary(
    summary: dict[str, Any],
    source: Path,
    where: str,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Append a finished run (its ``summary.json``) to the store ``where`` and compare each of
    its drills with their history.

    Args:
        summary: the run's summary.
        source: its evidence folder.
        where: the store (:func:`~.store.database_url`).
        progress: where the lines go: one per reason of a drill that regressed, improved or
            changed settings, then one line with the run's id and the readings' counts.

    Returns:
        ``summary.json``'s ``history`` block: ``store`` (password hidden), ``run_id``,
        ``drills`` (``{drill: DrillComparison.as_dict()}``), ``trends`` (``{drill:
        trend_doc}``: the drill's last :data:`TREND_RUNS` runs on the target, this one last;
        :func:`~.render.trend_doc`), ``regressed`` (drill names).

    Raises:
        ConfigError: the store cannot be opened, or the summary is not one chaos-infer wrote.
    """
    run = record_from_summary(summary, source)
    with open_store(where) as store:
        comparisons = compare_run(store, run)
        run_id, _ = store.append(run)
        trends = {
            d.drill: trend_doc(store.drills(drill=d.drill, target_key=run.target_key), TREND_RUNS)
            for d in run.drills
        }
    regressed = [name for name, c in comparisons.items() if c.reading == "regressed"]
    counts: dict[str, int] = {}
    for name, c in comparisons.items():
        counts[c.reading] = counts.get(c.reading, 0) + 1
        if c.reading in ("regressed", "improved") or c.settings_changed:
            for reason in c.reasons:
                progress(f"history: {name} {c.reading.upper()}: {reason}")
    progress(
        f"history: run #{run_id} in {shown_url(where)}; "
        + ", ".join(f"{n} drill(s) {reading}" for reading, n in sorted(counts.items()))
        + (f" (fewer than {MIN_RUNS} comparable runs)" if "not compared" in counts else "")
    )
    return {
        "store": shown_url(where),
        "run_id": run_id,
        "drills": {name: c.as_dict() for name, c in comparisons.items()},
        "trends": trends,
        "regressed": regressed,
    }
