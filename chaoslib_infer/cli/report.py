"""``chaos-infer report``: re-render the evidence of a game-day folder."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from chaoslib_infer.errors import InferChaosError

from .common import fail
from .usage import OneLineCommand

__all__ = ["report"]


@click.command(cls=OneLineCommand)
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--runbooks",
    "runbooks_path",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Also fill the Evidence section of the runbooks in this folder (e.g. runbooks/) "
    "from RUN_DIR, so each runbook carries its latest proof.",
)
@click.option(
    "--junit-inconclusive",
    type=click.Choice(["failure", "skipped"]),
    default=None,
    help="How junit.xml writes an inconclusive drill: a <failure> or <skipped> (default: as the "
    "game day recorded it, else failure).",
)
def report(run_dir: Path, runbooks_path: Path | None, junit_inconclusive: str | None) -> None:
    """Re-render the evidence (per-drill evidence, index.html, junit.xml, runbooks) of an
    existing game-day folder RUN_DIR, including one whose runner was killed mid-drill."""
    from chaoslib_infer.evidence.runbooks import fill_runbooks
    from chaoslib_infer.gameday import report_run

    try:
        code = report_run(
            run_dir, progress=lambda m: click.echo(m), junit_inconclusive=junit_inconclusive
        )
        if runbooks_path is not None:
            written = fill_runbooks(run_dir, runbooks_path)
            click.echo(f"runbooks filled: {', '.join(sorted(written)) or 'none'}")
    except InferChaosError as exc:
        fail(str(exc))
        return
    except (OSError, ValueError) as exc:
        fail(f"{runbooks_path}: {exc}")
        return
    sys.exit(code)
