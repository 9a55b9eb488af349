"""What ``chaos-infer history`` prints and ``index.html`` shows: the run list, a drill's trend
over its runs (settings changes between them named) and the comparison rows. Pure functions
over the store's records; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .compare import DRILL_FIGURES, KEY_FIGURES, DrillComparison
from .record import settings_diff
from .store import StoredDrill

__all__ = ["runs_table", "trend_doc", "trend_lines"]

_KEY_NAMES = [k.name for k in KEY_FIGURES]


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"


def runs_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The run list, one line per run: ``#ID started kind plan target verdict drills source``."""
    if not rows:
        return ["no runs recorded"]
    out = [f"{'run':>5}  {'started (UTC)':19}  {'kind':8} {'plan':22} {'target':18} verdict"]
    for r in rows:
        out.append(
            f"#{r['id']:<4}  {str(r['started_at'])[:19]:19}  {r['kind']:8} {r['plan'][:22]:22} "
            f"{r['target_key'][:18]:18} {r.get('verdict') or '—'} ({r['drills']} drill(s))"
            + (f"  {r['source']}" if r.get("source") else "")
        )
    return out


def trend_doc(series: Sequence[StoredDrill], last: int) -> dict[str, Any]:
    """A drill's trend on one target: its newest ``last`` runs, oldest first, with its key
    figures (:data:`~.compare.DRILL_FIGURES`) it measured and the settings changes between consecutive runs.

    Returns:
        ``{drill, target, runs: [{run_id, started_at, status, settings_hash, figures,
        settings_changed}], figures: [names]}`` (JSON-ready; ``settings_changed`` lists what
        changed since the run before it).
    """
    shown = list(series)[-last:]
    family = DRILL_FIGURES.get(shown[0].drill.drill, tuple(_KEY_NAMES)) if shown else ()
    names = [n for n in family if any(n in s.drill.figures for s in shown)]
    runs = []
    prev = None
    for s in shown:
        changed: list[str] = (
            settings_diff(prev.drill.settings, s.drill.settings)
            if prev is not None and prev.drill.settings_hash != s.drill.settings_hash
            else []
        )
        runs.append(
            {
                "run_id": s.run_id,
                "started_at": s.started_at,
                "kind": s.kind,
                "status": s.drill.status,
                "settings_hash": s.drill.settings_hash,
                "figures": {n: s.drill.figures.get(n) for n in names},
                "settings_changed": changed,
            }
        )
        prev = s
    first = shown[0] if shown else None
    return {
        "drill": first.drill.drill if first else None,
        "target": first.target_key if first else None,
        "figures": names,
        "runs": runs,
    }


def trend_lines(doc: dict[str, Any], comparison: DrillComparison | None = None) -> list[str]:
    """The trend table of :func:`trend_doc` as text, a ``settings changed`` line where they
    changed, then the newest run's comparison reading and reasons."""
    names = doc["figures"]
    out = [f"{doc['drill']} on {doc['target']} (last {len(doc['runs'])} run(s))"]
    head = f"  {'run':>5} {'started (UTC)':19} {'verdict':12} {'settings':8} " + " ".join(
        f"{n:>14}" for n in names
    )
    out.append(head)
    for r in doc["runs"]:
        if r["settings_changed"]:
            out.append("  -- settings changed: " + "; ".join(r["settings_changed"]))
        out.append(
            f"  #{r['run_id']:<4} {str(r['started_at'])[:19]:19} {r['status']:12} "
            f"{r['settings_hash'][:8]:8} "
            + " ".join(f"{_cell(r['figures'][n]):>14}" for n in names)
        )
    if comparison is not None:
        out.append(f"  newest run vs the ones before it: {comparison.reading}")
        out += [f"    - {reason}" for reason in comparison.reasons]
    return out
