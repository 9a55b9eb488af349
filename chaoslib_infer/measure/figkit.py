"""The vocabulary a figure function shares: markers and their colours, the drill's context,
and the small readers (JSONL, numbers, times) every kind uses.

Dependency-free (stdlib only) and in :mod:`chaoslib_infer.measure`, under the drills, so a drill's
room (``chaoslib_infer/drills/<drill>/figures.py``) and the non-drill kinds
(``chaoslib_infer/evidence/kinds/``) import it without importing
:mod:`chaoslib_infer.evidence.figures`, which finds the rooms' figures through
:mod:`chaoslib_infer.drills.registry` (issue 22: no package cycle). :mod:`chaoslib_infer.evidence.figures`
re-exports every name here.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "FAULT",
    "MILESTONE",
    "RECOVERY",
    "REMOVED",
    "STOP",
    "DrillContext",
    "Marker",
    "json_objects",
    "mark",
    "num",
    "read_jsonl",
    "unix_time",
]

#: A vertical line on the drill's plots: ``(unix seconds, label, colour)``.
Marker = tuple[float, str, str]
#: Marker colours by meaning: fault injected, fault removed, an intermediate event (a death, an
#: ejection, a scale-out trigger), a recovery point (ready, serving, back in bands), stop condition.
FAULT = "#d62728"
REMOVED = "#8c564b"
MILESTONE = "#9467bd"
RECOVERY = "#2ca02c"
STOP = "#ff7f0e"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL file, skipping unparsable lines (a writer killed mid-line). Missing file: []."""
    if not path.exists():
        return []
    return json_objects(path.read_text(encoding="utf-8", errors="replace"))


def json_objects(text: str) -> list[dict[str, Any]]:
    """The JSON objects of JSONL ``text``, in order: one per line that parses to an object.

    Blank lines, lines that do not parse (a writer killed mid-line) and lines holding another
    JSON value (a list, a number) are skipped. Never raises.
    """
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def num(value: Any) -> float | None:
    """Return ``value`` as a float, or ``None``."""
    return None if value is None else float(value)


def mark(t: Any, label: str, colour: str) -> list[Marker]:
    """``[(t, label, colour)]``, or ``[]`` when ``t`` is None (a point the run never reached)."""
    return [] if t is None or isinstance(t, bool) else [(float(t), label, colour)]


def unix_time(value: Any) -> float | None:
    """A time given as unix seconds or ISO 8601 text (``summary.json``) as unix seconds.

    Returns:
        Unix seconds, or None for None, empty or unparsable text (a naive ISO time is UTC).
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        parsed = dt.datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


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
