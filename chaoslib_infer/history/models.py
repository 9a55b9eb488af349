"""The history store's tables (SQLAlchemy Core), schema version :data:`SCHEMA_REVISION`.

The tables are created and changed only by the Alembic migrations in ``migrations/versions/``
(:func:`chaoslib_infer.history.store.open_store` upgrades a database to the newest on open); this
module is what the code reads and writes through, and must match the newest migration
(``tests/test_history_store.py`` checks that it does).

- ``runs``: one game day, drill run or certification (``kind``), its plan, target, tool versions.
- ``drill_runs``: one drill of a run: its verdict, reasons, settings (and their hash), costs,
  windows' request counts, every numeric figure (JSON).
- ``figures``: the drill's numeric figures again, one row each, for SQL and dashboards.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

__all__ = ["SCHEMA_REVISION", "drill_runs", "figures", "metadata", "runs"]

#: the Alembic revision these tables match (the newest in ``migrations/versions/``)
SCHEMA_REVISION = "0001"

metadata = MetaData()

runs = Table(
    "runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # plan + start time + kind: the same evidence folder imported twice is one run
    Column("run_key", String(64), nullable=False, unique=True),
    Column("kind", String(16), nullable=False),  # gameday | drill | certify
    Column("plan", String(200), nullable=False),
    Column("plan_path", Text),
    Column("target_key", String(400), nullable=False),
    Column("target", JSON),
    Column("started_at", String(40), nullable=False),  # ISO 8601, UTC
    Column("started_unix", Float, nullable=False, index=True),
    Column("ended_at", String(40)),
    Column("verdict", String(20)),
    Column("complete", Boolean),
    Column("engine", String(200)),
    Column("product_version", String(40)),
    Column("tool", JSON),
    Column("source", Text),  # the evidence folder
)

drill_runs = Table(
    "drill_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("drill", String(100), nullable=False, index=True),
    Column("status", String(20), nullable=False),
    Column("reasons", JSON),
    Column("settings_hash", String(16), nullable=False),
    Column("settings", JSON),
    Column("costs", JSON),
    Column("windows", JSON),
    Column("figures", JSON),
)

figures = Table(
    "figures",
    metadata,
    Column(
        "drill_run_id",
        Integer,
        ForeignKey("drill_runs.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("name", String(100), primary_key=True),
    Column("value", Float),
)
