"""``chaos-infer certify``: inference providers side by side."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from chaoslib_infer.errors import ConfigError
from chaoslib_infer.evidence.outdir import prepare_out_dir

from .common import fail
from .usage import OneLineCommand

__all__ = ["certify"]


@click.command(cls=OneLineCommand)
@click.option(
    "--target", "targets", multiple=True, metavar="FILE",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Target file (YAML: name, profile vllm|sglang|tgi|trtllm|ark|openai, url, model, "
    "api_key_env or api_key_file, price); repeat for each target to compare.",
)  # fmt: skip
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("certify-out"),
              show_default=True, help="Folder for the report and the evidence.")  # fmt: skip
@click.option("--plan", "plan_path", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="Certification plan (default drills/certification.yaml).")  # fmt: skip
@click.option("--quick", is_flag=True, help="The plan's quick scale: seconds per target.")
@click.option("--scale", type=float, default=1.0, show_default=True,
              help="Multiply every phase duration and count.")  # fmt: skip
@click.option("--soak-s", type=float, default=None, help="Soak duration in seconds.")
@click.option("--allow", multiple=True, metavar="PATTERN",
              help="Allow target URLs matching SCHEME://HOST[:PORT] (default: loopback only).")  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Print the plan and the targets; send nothing.")
@click.option("--history", "history", default=None, metavar="URL",
              help="History store the certification is appended to (an SQLite path or "
              "postgresql://...; 'off': none; default $CHAOS_INFER_HISTORY, else "
              ".chaos-infer/history.sqlite).")  # fmt: skip
def certify(
    targets: tuple[Path, ...],
    out_dir: Path,
    plan_path: Path | None,
    quick: bool,
    scale: float,
    soak_s: float | None,
    allow: tuple[str, ...],
    dry_run: bool,
    history: str | None,
) -> None:
    """Certify inference providers side by side: three-phase load test, soak, client-side faults.

    Exit code 0 when every target is certified, 1 when one is not, 2 on bad input or an
    unreachable target, 130 when interrupted. See docs/certification.md.
    """
    from chaoslib_infer.certify import certify_command
    from chaoslib_infer.history.store import database_url, resolve_where

    where = resolve_where(history)
    try:
        if where is not None:
            database_url(where, create=False)
    except ConfigError as exc:
        fail(str(exc))

    try:
        prepare_out_dir(out_dir, create=not dry_run)
    except ConfigError as exc:
        fail(str(exc))
    try:
        code = certify_command(
            targets,
            out_dir,
            plan_path,
            quick,
            scale,
            soak_s,
            allow,
            dry_run,
            echo=click.echo,
            err=lambda m: click.echo(m, err=True),
            history=where,
        )  # fmt: skip
    except UnicodeDecodeError as exc:  # a --target or --plan file
        fail(f"--target/--plan: a file is not UTF-8 text (byte {exc.start})")
        return
    sys.exit(code)
