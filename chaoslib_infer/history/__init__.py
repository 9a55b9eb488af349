"""Game days that remember (issue 32): every game day, drill run and certification appended to
a history store (SQLite by default, PostgreSQL by URL), each drill's key figures compared with
its last comparable runs (``regressed``, ``improved``, ``within noise``), shown by
``chaos-infer history`` and in the game day's ``index.html``.

Modules: :mod:`.models` (tables), ``migrations/`` (Alembic), :mod:`.store` (open, upgrade,
append, read), :mod:`.record` (a run from its ``summary.json``), :mod:`.stats` and
:mod:`.compare` (the comparison verdict), :mod:`.runs` (record and compare a run),
:mod:`.render` (tables, HTML trend).

Layer: beside the game day and the report (it reads their ``summary.json``), above evidence;
nothing below imports it.
"""

from __future__ import annotations

from .compare import ALPHA, LAST_N, MIN_RUNS, DrillComparison, compare_drill
from .record import RunRecord, read_summary, record_from_summary
from .runs import compare_run, record_summary
from .store import DEFAULT_HISTORY, HISTORY_ENV, HistoryStore, open_store, shown_url

__all__ = [
    "ALPHA",
    "DEFAULT_HISTORY",
    "HISTORY_ENV",
    "LAST_N",
    "MIN_RUNS",
    "DrillComparison",
    "HistoryStore",
    "RunRecord",
    "compare_drill",
    "compare_run",
    "open_store",
    "read_summary",
    "record_from_summary",
    "record_summary",
    "shown_url",
]
