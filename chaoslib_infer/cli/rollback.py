"""``chaos-infer rollback``: undo the faults a killed runner left behind (lab and Kubernetes)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .common import DEFAULT_LAB_DIR
from .usage import OneLineCommand

__all__ = ["rollback"]


@click.command(cls=OneLineCommand)
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=DEFAULT_LAB_DIR,
    show_default=True,
    help="Lab state directory (a game day's is OUT/lab).",
)
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Kubernetes: a drill's run dir or a game day's --out folder. Undo the cluster faults "
    "its killed drills left saved in <run dir>/k8s-state/*.json (quota cut, cordon, taint, "
    "deleted Node, freeze, ingress block, memory hog, netem), each with its rollback action, "
    "against the target file recorded at injection. The lab ledger is then left alone unless "
    "--state-dir is given too.",
)
@click.option(
    "--target",
    "target_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="With --run-dir: the Kubernetes target file for state files that record none "
    "(default $CHAOS_INFER_K8S_TARGET). A recorded one is always used.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="List what would be undone and change nothing (no API call, no file touched).",
)
@click.pass_context
def rollback(
    ctx: click.Context,
    state_dir: Path,
    run_dir: Path | None,
    target_file: Path | None,
    dry_run: bool,
) -> None:
    """Undo every fault a killed runner left behind; print one line per fault.

    \b
    Lab: the faults still recorded in the lab's ledger (STATE_DIR/faults.json).
    Kubernetes (--run-dir DIR): the faults saved in DIR/k8s-state/ or DIR/*/k8s-state/
    (a game day's bundle has one run dir per drill); each is undone by its rollback action
    (k8s_restore_quota, k8s_uncordon_node, k8s_remove_node_taint, k8s_restore_node,
    k8s_thaw_model_server, k8s_restore_pod_ingress, k8s_stop_memory_hog,
    k8s_remove_network_jitter), which removes the file once done: a second run is a no-op.

    Exit 0 when everything pending was undone (or nothing was pending), 1 when an undo failed
    (one line each on stderr; the record or state file stays), 2 when the ledger is unreadable,
    holds a record that is not a fault of this lab (unregistered module, foreign name or pid,
    stored argv: nothing is undone, nothing of it runs) or the run dir does not exist.
    """
    from click.core import ParameterSource

    codes = []
    if run_dir is not None:
        codes.append(_rollback_k8s(run_dir, target_file, dry_run))
    if run_dir is None or ctx.get_parameter_source("state_dir") is not ParameterSource.DEFAULT:
        codes.append(_rollback_lab(state_dir, dry_run))
    if max(codes):
        sys.exit(max(codes))


def _rollback_lab(state_dir: Path, dry_run: bool) -> int:
    """The lab part of ``rollback``: replay (or, dry, list) the ledger; the exit code."""
    from chaoslib_infer.lab.fleet import LAB_FILE, Lab, LabError
    from chaoslib_infer.lab.ledger import describe, pending_faults
    from chaoslib_infer.lab.ledger import rollback as do_rollback
    from chaoslib_infer.lab.registry import LedgerRefused, validate

    try:
        if dry_run:
            if not (state_dir / LAB_FILE).exists():
                click.echo(f"rollback: no lab in {state_dir}: nothing to roll back")
                return 0
            pending = pending_faults(state_dir)
            lab = Lab.attach(state_dir)
            refused = 0
            for record in pending:
                try:
                    validate(lab, record)
                except LedgerRefused as exc:
                    refused += 1
                    click.echo(f"refused: {exc}")
                    continue
                click.echo(f"would undo: {describe(record)}")
            click.echo(
                f"rollback: dry run: {len(pending)} fault(s) pending in {state_dir}; "
                "nothing was changed"
            )
            if refused:
                click.echo(
                    f"chaos-infer: error: {refused} ledger record(s) in {state_dir} are not "
                    "faults of this lab: a rollback would undo nothing; fix or remove them by hand",
                    err=True,
                )
                return 2
            return 0
        result = do_rollback(state_dir)
    except LabError as exc:
        click.echo(f"chaos-infer: error: {exc}", err=True)
        return 2
    if not result.lab_found:
        click.echo(f"rollback: no lab in {state_dir}: nothing to roll back")
        return 0
    for record in result.pending:
        click.echo(f"pending: {describe(record)}")
    for line in result.undone:
        click.echo(f"undone: {line}")
    if not result.pending and not result.undone:
        click.echo(f"rollback: nothing pending in {result.state_dir}")
        return 0
    if result.failed:
        click.echo(
            f"chaos-infer: error: {len(result.failed)} fault(s) could not be undone: "
            f"{result.failed[0]}",
            err=True,
        )
        return 1
    click.echo(f"rollback: {len(result.undone)} fault(s) undone in {result.state_dir}")
    return 0


def _rollback_k8s(run_dir: Path, target_file: Path | None, dry_run: bool) -> int:
    """The Kubernetes part of ``rollback``: replay (or, dry, list) the saved states; exit code."""
    from chaoslib_infer.k8s_replay import replay

    if not run_dir.is_dir():
        click.echo(f"chaos-infer: error: --run-dir {run_dir}: no such folder", err=True)
        return 2
    result = replay(run_dir, str(target_file) if target_file else None, dry_run=dry_run)
    for line in result.undone:
        click.echo(f"{'would undo' if dry_run else 'undone'}: {line}")
    for line in result.failed:
        click.echo(f"chaos-infer: error: rollback: {line}", err=True)
    root = run_dir.resolve()
    if not result.pending:
        click.echo(f"rollback: no Kubernetes fault pending under {root}")
    elif dry_run:
        click.echo(
            f"rollback: dry run: {len(result.pending)} Kubernetes fault(s) pending under {root}; "
            "nothing was changed"
        )
    else:
        click.echo(
            f"rollback: {len(result.undone)} of {len(result.pending)} Kubernetes fault(s) "
            f"undone under {root}"
        )
    return 1 if result.failed else 0
