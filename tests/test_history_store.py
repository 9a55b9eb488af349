"""The history store (issue 32) on SQLite and on a real PostgreSQL server: the schema made by
the Alembic migrations (and matching the code's tables), runs appended once, read back with
their figures; the import of real evidence folders (``tests/data/history``: drill runs of
oom-kill made in the lab, one before settings were recorded) through ``chaos-infer history``,
its trend naming a settings change, its bad input refused in one line."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from pgserver import pg_skip_reason, postgres_server

from chaoslib_infer.cli import main
from chaoslib_infer.history import open_store, read_summary
from chaoslib_infer.history.models import SCHEMA_REVISION, metadata

DATA = Path(__file__).parent / "data" / "history"
#: the real drill runs, oldest first (tests/data/history/README.md)
UNCHANGED = ["w1", "w2", "w3", "w4", "w5", "w6"]


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    reason = pg_skip_reason()
    if reason:
        pytest.skip(reason)
    with postgres_server() as url:
        yield url


_DB_SEQ = iter(range(1_000_000))


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store of each kind (PostgreSQL: a new database on the module's server)."""
    if request.param == "sqlite":
        return str(tmp_path / "h" / "history.sqlite")
    import psycopg

    base = request.getfixturevalue("pg_url")
    name = f"h{next(_DB_SEQ)}"
    with psycopg.connect(base, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return base.rsplit("/", 1)[0] + "/" + name


def test_the_migrations_make_the_code_s_schema(store_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    with open_store(store_url) as store:
        assert store.revision() == SCHEMA_REVISION
        with store.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
        assert diff == [], diff
    with open_store(store_url) as store:  # opening again: already current, nothing to do
        assert store.revision() == SCHEMA_REVISION


def test_a_run_is_stored_once_and_read_back(store_url: str) -> None:
    runs = [read_summary(DATA / name) for name in ("w1", "w-noretry")]
    with open_store(store_url) as store:
        first, new = store.append(runs[0])
        assert new
        assert store.append(runs[0]) == (first, False)  # the same folder again: one run
        store.append(runs[1])
        listed = store.runs()
        assert [r["drills"] for r in listed] == [1, 1]
        assert [r["kind"] for r in listed] == ["drill", "drill"]
        back = store.drills(drill="oom-kill", target_key="lab:sim:x3")
        assert [b.run_id for b in back] == [r["id"] for r in listed]
        summary = json.loads((DATA / "w1" / "summary.json").read_text())
        figures = summary["drills"][0]["figures"]
        assert back[0].drill.figures["restart_s"] == figures["restart_s"]
        assert back[0].drill.figures["failed_requests"] == figures["failed_requests"]
        assert back[0].drill.status == summary["drills"][0]["status"]
        assert back[0].drill.settings_hash != back[1].drill.settings_hash  # gateway_retry off
        assert store.drills(drill="node-loss") == []
        assert store.drills(target="url:") == []
        with store.engine.connect() as conn:
            import sqlalchemy as sa

            n = conn.execute(sa.text("select count(*) from figures")).scalar_one()
        assert n == len(back[0].drill.figures) + len(back[1].drill.figures)


def _cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_old_evidence_folders_import_and_trend(tmp_path: Path) -> None:
    """Every real folder imports (oldest first, whatever the order given); the comparison and
    the trend name the settings changes (the pre-settings folder, the gateway's retries off);
    a folder given again is skipped."""
    folders = []
    for name in ["pre-settings", *UNCHANGED, "w-noretry"]:
        shutil.copytree(DATA / name, tmp_path / name)
        folders.append(str(tmp_path / name))
    db = str(tmp_path / "h.sqlite")
    code, out, err = _cli("history", "import", *reversed(folders), "--history", db)
    assert code == 0, err
    assert out.index(f"{tmp_path}/pre-settings: run #1") < out.index(f"{tmp_path}/w1: run #2")
    # pre-settings predates recorded settings: its successor names the change, compares nothing
    assert "settings changed since run #1 (client.load." in out
    assert out.count("oom-kill: within noise") == 3  # w4, w5, w6 against the runs before them
    assert "regressed" not in out and "improved" not in out
    code, out, _ = _cli("history", "import", folders[0], "--history", db)
    assert code == 0 and "already stored as run #1" in out
    code, out, _ = _cli("history", "--history", db, "--json")
    rows = json.loads(out)
    assert len(rows) == len(folders) and all(r["kind"] == "drill" for r in rows)
    code, out, _ = _cli("history", "trend", "--history", db, "--drill", "oom-kill", "--json")
    assert code == 0
    (doc,) = json.loads(out)
    assert doc["target"] == "lab:sim:x3"
    assert doc["figures"] == ["restart_s", "interruption_s", "failed_requests", "budget_share"]
    truth = [json.loads((DATA / n / "summary.json").read_text()) for n in UNCHANGED]
    assert [r["figures"]["restart_s"] for r in doc["runs"][1:7]] == [
        t["drills"][0]["figures"]["restart_s"] for t in truth
    ]
    assert doc["runs"][-1]["settings_changed"] == ["gateway.gateway_retry: true -> false"]
    assert doc["comparison"]["reading"] == "not compared"
    assert doc["comparison"]["settings_changed"] == ["gateway.gateway_retry: true -> false"]
    code, out, _ = _cli("history", "--history", db, "trend", "--last", "3")  # the group's store
    assert "-- settings changed: gateway.gateway_retry: true -> false" in out
    assert "newest run vs the ones before it: not compared" in out
    code, out, _ = _cli("history", "list", "--history", db, "--since", "2999-01-01")
    assert code == 0 and out.strip() == "no runs recorded"


@pytest.mark.parametrize(
    ("run", "reading"), [("w-slow12", "within noise"), ("w-slow30", "regressed")]
)
def test_real_slower_restarts_against_real_unchanged_runs(run: str, reading: str) -> None:
    """The engine's load delay raised from 1 s to 12 s and to 30 s, each against the six
    unchanged runs (restarts of 2.9-7.6 s on a shared machine): 12 s is within their noise,
    30 s is a regression of restart_s and of nothing else."""
    from chaoslib_infer.history.compare import compare_drill
    from chaoslib_infer.history.runs import past_of
    from chaoslib_infer.history.store import StoredDrill

    hist = [read_summary(DATA / n) for n in UNCHANGED]
    past = past_of(
        [
            StoredDrill(i + 1, r.kind, r.plan, r.target_key, r.started_at, 0.0, r.verdict,
                        r.source, r.tool, r.drills[0])
            for i, r in enumerate(hist)
        ]
    )  # fmt: skip
    new = read_summary(DATA / run).drills[0]
    c = compare_drill(new, past)
    assert c.reading == reading, c.reasons
    assert c.settings_changed == []
    flagged = [f.figure for f in c.figures if f.reading != "within noise"]
    assert flagged == (["restart_s"] if reading == "regressed" else [])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["history", "import", "/nonexistent-folder"], "no summary.json (not an evidence folder)"),
        (["history", "--history", "mysql://u@h/db"], "mysql:// is not a supported store"),
        (["history", "list", "--since", "last tuesday"], "expected an ISO 8601 date"),
        (["history", "--history", "postgresql://nobody@127.0.0.1:1/x"], "cannot open"),
    ],
)
def test_bad_input_is_one_line(args: list[str], says: str, tmp_path: Path) -> None:
    if "--history" not in args:
        args = [*args, "--history", str(tmp_path / "h.sqlite")]
    code, out, err = _cli(*args)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("chaos-infer: error: ") and says in lines[0]
    assert "Traceback" not in err
