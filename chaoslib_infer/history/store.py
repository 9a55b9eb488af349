"""The history store: a database of runs (SQLite by default, PostgreSQL by URL), opened and
upgraded to the newest schema, appended to and read back.

A store is named by a URL or a path: ``postgresql://user@host/db`` (psycopg 3 is used for
``postgresql://``), ``sqlite:///path`` or a plain file path (an SQLite file, created with its
folder). :func:`open_store` runs the Alembic migrations shipped in ``migrations/`` up to the
newest revision on every open (a no-op when the database is current), so a team database
upgrades itself the first time a newer chaos-infer writes to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext

from chaoslib_infer.errors import ConfigError

from .models import SCHEMA_REVISION, drill_runs, figures, runs
from .record import DrillRecord, RunRecord

__all__ = [
    "DEFAULT_HISTORY",
    "HISTORY_ENV",
    "OFF",
    "HistoryStore",
    "StoredDrill",
    "database_url",
    "open_store",
    "resolve_where",
    "shown_url",
]

#: the store when nothing names one: an SQLite file beside the lab's state folder
DEFAULT_HISTORY = ".chaos-infer/history.sqlite"
#: the environment variable naming the store (under ``--history``, over the plan's ``history:``)
HISTORY_ENV = "CHAOS_INFER_HISTORY"

_MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def database_url(where: str, create: bool = True) -> str:
    """The SQLAlchemy URL of a store named by ``where`` (a URL or an SQLite file path).

    ``postgresql://`` and ``postgres://`` get the psycopg 3 driver; a path becomes
    ``sqlite:///ABSOLUTE`` (its folder is created unless ``create`` is False).

    Raises:
        ConfigError: an empty name, or a URL scheme other than sqlite or postgresql.
    """
    where = where.strip()
    if not where:
        raise ConfigError("history: empty store name (a file path or a database URL)")
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", where)
    if m is None:
        path = Path(where).expanduser().resolve()
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"
    scheme = m.group(1).lower()
    rest = where[m.end() :]
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        return f"postgresql+psycopg://{rest}"
    if scheme == "sqlite":
        return where
    raise ConfigError(
        f"history: {scheme}:// is not a supported store (an SQLite file path, sqlite:///PATH "
        "or postgresql://USER@HOST/DB)"
    )


def shown_url(where: str) -> str:
    """``where`` with any password replaced by ``***`` (for messages and ``summary.json``)."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", where)


@dataclass(frozen=True)
class StoredDrill:
    """One drill of a stored run, as read back: the drill's record and its run's identity.

    Attributes:
        run_id: the run's row id (``chaos-infer history`` prints it as ``#ID``).
        kind, plan, target_key, started_at, started_unix, verdict, source, tool: the run's.
        drill: the drill's :class:`~chaoslib_infer.history.record.DrillRecord`.
    """

    run_id: int
    kind: str
    plan: str
    target_key: str
    started_at: str
    started_unix: float
    verdict: str | None
    source: str | None
    tool: dict[str, Any]
    drill: DrillRecord


class HistoryStore:
    """An open store (:func:`open_store`); use as a context manager or call :meth:`close`."""

    def __init__(self, engine: sa.engine.Engine, where: str) -> None:
        self.engine = engine
        self.where = where

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the database connections."""
        self.engine.dispose()

    def revision(self) -> str | None:
        """The schema revision the database is at (Alembic's ``alembic_version``)."""
        with self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def append(self, run: RunRecord) -> tuple[int, bool]:
        """Store ``run`` and its drills.

        Returns:
            ``(run id, True)``, or ``(the stored run's id, False)`` when a run with the same
            key (plan, kind, start time) is stored already: nothing is written twice.
        """
        with self.engine.begin() as conn:
            old = conn.execute(sa.select(runs.c.id).where(runs.c.run_key == run.key)).first()
            if old is not None:
                return int(old[0]), False
            run_id = _new_id(conn.execute(runs.insert().values(**run.row())))
            for d in run.drills:
                drill_id = _new_id(
                    conn.execute(drill_runs.insert().values(run_id=run_id, **d.row()))
                )
                rows = [
                    {"drill_run_id": drill_id, "name": k, "value": v}
                    for k, v in sorted(d.figures.items())
                ]
                if rows:
                    conn.execute(figures.insert(), rows)
        return int(run_id), True

    def drills(
        self,
        *,
        drill: str | None = None,
        target: str | None = None,
        target_key: str | None = None,
        plan: str | None = None,
        since_unix: float | None = None,
        before_unix: float | None = None,
    ) -> list[StoredDrill]:
        """The stored drills, oldest first, narrowed by the arguments (``target``: a substring
        of the target key; ``target_key`` and the others exact; ``before_unix``: runs started
        before it)."""
        q = (
            sa.select(runs, drill_runs)
            .join(drill_runs, drill_runs.c.run_id == runs.c.id)
            .order_by(runs.c.started_unix, runs.c.id, drill_runs.c.id)
        )
        if drill:
            q = q.where(drill_runs.c.drill == drill)
        if plan:
            q = q.where(runs.c.plan == plan)
        if target:
            q = q.where(runs.c.target_key.contains(target, autoescape=True))
        if target_key:
            q = q.where(runs.c.target_key == target_key)
        if since_unix is not None:
            q = q.where(runs.c.started_unix >= since_unix)
        if before_unix is not None:
            q = q.where(runs.c.started_unix < before_unix)
        out = []
        with self.engine.connect() as conn:
            for row in conn.execute(q).mappings():
                out.append(
                    StoredDrill(
                        run_id=int(row[runs.c.id]),
                        kind=row[runs.c.kind],
                        plan=row[runs.c.plan],
                        target_key=row[runs.c.target_key],
                        started_at=row[runs.c.started_at],
                        started_unix=float(row[runs.c.started_unix]),
                        verdict=row[runs.c.verdict],
                        source=row[runs.c.source],
                        tool=dict(row[runs.c.tool] or {}),
                        drill=DrillRecord.from_row(dict(row)),
                    )
                )
        return out

    def runs(self, since_unix: float | None = None) -> list[dict[str, Any]]:
        """The stored runs, oldest first: ``id, kind, plan, target_key, started_at, verdict,
        source, drills`` (the number of drills)."""
        n = sa.func.count(drill_runs.c.id).label("drills")
        q = (
            sa.select(
                runs.c.id,
                runs.c.kind,
                runs.c.plan,
                runs.c.target_key,
                runs.c.started_at,
                runs.c.verdict,
                runs.c.source,
                n,
            )
            .outerjoin(drill_runs, drill_runs.c.run_id == runs.c.id)
            .group_by(runs.c.id)
            .order_by(runs.c.started_unix, runs.c.id)
        )
        if since_unix is not None:
            q = q.where(runs.c.started_unix >= since_unix)
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(q).mappings()]


def _new_id(result: sa.engine.CursorResult[Any]) -> int:
    key = result.inserted_primary_key
    if key is None:  # every table here has an integer primary key
        raise RuntimeError("history: the database returned no id for a new row")
    return int(key[0])


def _upgrade(engine: sa.engine.Engine) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def open_store(where: str) -> HistoryStore:
    """Open the store named by ``where`` (:func:`database_url`), upgraded to the newest schema.

    Raises:
        ConfigError: a bad name, an unreachable database, or one at a schema revision newer than
            this chaos-infer knows (one line, the password hidden).
    """
    url = database_url(where)
    try:
        engine = sa.create_engine(url, future=True)
    except (sa.exc.ArgumentError, ImportError) as exc:
        raise ConfigError(f"history: {shown_url(where)}: {exc}") from None
    try:
        _upgrade(engine)
    except sa.exc.OperationalError as exc:
        engine.dispose()
        first = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise ConfigError(f"history: {shown_url(where)}: cannot open: {first}") from None
    except Exception as exc:  # alembic: a revision this version does not know
        engine.dispose()
        if "Can't locate revision" in str(exc):
            raise ConfigError(
                f"history: {shown_url(where)}: its schema is newer than this chaos-infer "
                f"knows (newest here: {SCHEMA_REVISION}); upgrade chaos-infer"
            ) from None
        raise
    return HistoryStore(engine, where)


#: names of the store that turn the history off (``--history off``, ``history: off``)
OFF = ("off", "none", "no")


def resolve_where(option: str | None, plan_history: str | None = None) -> str | None:
    """The store a run writes to: ``--history`` (``option``), else ``$CHAOS_INFER_HISTORY``,
    else the plan's ``history:``, else :data:`DEFAULT_HISTORY`; None when that names
    :data:`OFF`."""
    import os

    for value in (option, os.environ.get(HISTORY_ENV), plan_history, DEFAULT_HISTORY):
        if value is not None and str(value).strip():
            where = str(value).strip()
            return None if where.lower() in OFF else where
    return None
