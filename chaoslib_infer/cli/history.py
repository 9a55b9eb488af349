"""``chaos-infer history``: the runs a history store holds, a drill's trend over its runs with
the comparison verdict, and the import of existing evidence folders (issue 32)."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import click

from chaoslib_infer.errors import InferChaosError

from .common import fail
from .usage import OneLineGroup

__all__ = ["history", "history_option", "parse_since"]

_STORE_HELP = (
    "The history store: an SQLite file path or sqlite:///PATH, or postgresql://USER@HOST/DB "
    "(default: $CHAOS_INFER_HISTORY, else .chaos-infer/history.sqlite)."
)


def history_option(func: Any) -> Any:
    """The ``--history URL`` option of the history commands."""
    return click.option("--history", "where", default=None, metavar="URL", help=_STORE_HELP)(func)


def parse_since(text: str | None, now: float | None = None) -> float | None:
    """``--since``: an ISO 8601 date or time (UTC unless it says), or an age ``N[smhdw]``
    (``7d``: the last 7 days); unix seconds, or None.

    Raises:
        click.BadParameter: neither.
    """
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if m:
        scale = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]
        return (now if now is not None else time.time()) - float(m.group(1)) * scale
    from chaoslib_infer.history.record import unix_of

    try:
        return unix_of(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: expected an ISO 8601 date (2026-12-01) or an age (7d, 12h)"
        ) from None


_SINCE = click.option(
    "--since",
    default=None,
    metavar="WHEN",
    help="Only runs started since WHEN: a date or an age (7d).",
)
_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def _where(option: str | None) -> str:
    """The store: the subcommand's ``--history``, else the group's (``history --history URL
    trend``), else the environment's, else the default."""
    from chaoslib_infer.history.store import DEFAULT_HISTORY, resolve_where

    ctx = click.get_current_context(silent=True)
    if option is None and ctx is not None and ctx.parent is not None:
        group = ctx.parent.params.get("where")
        option = group if isinstance(group, str) else None
    return resolve_where(option) or DEFAULT_HISTORY


@click.group(cls=OneLineGroup, invoke_without_command=True)
@history_option
@_SINCE
@_JSON
@click.pass_context
def history(ctx: click.Context, where: str | None, since: str | None, as_json: bool) -> None:
    """The runs of the history store (every game day, drill run and certification), each
    drill's trend and its comparison with its last comparable runs. Without a subcommand: the
    run list (as `history list`)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(history_list, where=where, since=since, as_json=as_json)


@history.command("list")
@history_option
@_SINCE
@_JSON
def history_list(where: str | None, since: str | None, as_json: bool) -> None:
    """List the stored runs, oldest first."""
    from chaoslib_infer.history.render import runs_table
    from chaoslib_infer.history.store import open_store

    try:
        with open_store(_where(where)) as store:
            rows = store.runs(parse_since(since))
    except InferChaosError as exc:
        fail(str(exc))
        return
    if as_json:
        click.echo(json.dumps(rows, indent=1, default=str))
        return
    for line in runs_table(rows):
        click.echo(line)


@history.command("trend")
@history_option
@_SINCE
@_JSON
@click.option("--drill", default=None, help="Only this drill (default: every drill).")
@click.option(
    "--target", default=None, help="Only targets whose key contains this (lab:sim:x3, a URL)."
)
@click.option(
    "--last", type=click.IntRange(1, 1000), default=8, show_default=True, help="Runs per trend."
)
def history_trend(
    where: str | None,
    since: str | None,
    as_json: bool,
    drill: str | None,
    target: str | None,
    last: int,
) -> None:
    """Each drill's trend per target: its key figures over its last runs (settings changes
    between them named) and the newest run's comparison with the runs before it: regressed,
    improved or within noise, with the test's reason."""
    from chaoslib_infer.history.compare import compare_drill
    from chaoslib_infer.history.render import trend_doc, trend_lines
    from chaoslib_infer.history.runs import past_of
    from chaoslib_infer.history.store import open_store

    try:
        with open_store(_where(where)) as store:
            stored = store.drills(drill=drill, target=target, since_unix=parse_since(since))
    except InferChaosError as exc:
        fail(str(exc))
        return
    groups: dict[tuple[str, str], list[Any]] = {}
    for s in stored:
        groups.setdefault((s.drill.drill, s.target_key), []).append(s)
    docs = []
    for key in sorted(groups):
        series = groups[key]
        newest = series[-1]
        comparison = compare_drill(newest.drill, past_of(series[:-1]), new_tool=newest.tool)
        doc = trend_doc(series, last)
        doc["comparison"] = comparison.as_dict()
        docs.append((doc, comparison))
    if as_json:
        click.echo(json.dumps([d for d, _ in docs], indent=1, default=str))
        return
    if not docs:
        click.echo("no runs recorded" + (f" for drill {drill}" if drill else ""))
    for doc, comparison in docs:
        for line in trend_lines(doc, comparison):
            click.echo(line)
        click.echo("")


@history.command("import")
@click.argument("folders", nargs=-1, required=True, type=click.Path(path_type=Path))
@history_option
def history_import(folders: tuple[Path, ...], where: str | None) -> None:
    """Append existing evidence folders (their summary.json: game days, drill runs,
    certifications) to the store, oldest first; a folder already stored is skipped. Each
    drill is compared with the runs before it, as a new run would be."""
    from chaoslib_infer.history.record import read_summary, unix_of
    from chaoslib_infer.history.runs import compare_run
    from chaoslib_infer.history.store import open_store

    try:
        records = sorted(
            (read_summary(Path(f)) for f in folders), key=lambda r: unix_of(r.started_at)
        )
        with open_store(_where(where)) as store:
            for run in records:
                comparisons = compare_run(store, run)
                run_id, new = store.append(run)
                if not new:
                    click.echo(f"{run.source}: already stored as run #{run_id}")
                    continue
                click.echo(
                    f"{run.source}: run #{run_id} ({run.kind} {run.plan}, {run.started_at[:19]}, "
                    f"{len(run.drills)} drill(s))"
                )
                for name, c in comparisons.items():
                    click.echo(
                        f"  {name}: {c.reading}" + "".join(f"\n    - {r}" for r in c.reasons)
                    )
    except InferChaosError as exc:
        fail(str(exc))
        return
    sys.exit(0)
