"""``chaos-infer gameday``: every drill of a plan, with evidence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from chaoslib_infer.errors import InferChaosError

from .common import apply_gateway, fail, gateway_options
from .load_settings import apply_load_vars, load_options
from .plan_run import PlanRunOptions, run_plan, target_options
from .usage import OneLineCommand

__all__ = ["gameday"]


@click.command(cls=OneLineCommand)
@click.argument("plan", required=False, type=click.Path(path_type=Path))
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=Path("gameday-out"),
    show_default=True,
    help="Folder for the evidence bundle.",
)
@target_options
@gateway_options()
@load_options
def gameday(
    plan: Path | None,
    out_dir: Path,
    opts: PlanRunOptions,
    gateway: str | None = None,
    gateway_config: Path | None = None,
    load_vars: dict[str, Any] | None = None,
) -> None:
    """Run a game day: every drill of PLAN (default drills/gameday.yaml), with evidence.

    With --target TARGET.yaml (a Kubernetes target file) the default plan is
    drills/gameday-k8s.yaml and no lab is brought up.

    Each drill ends passed, failed, inconclusive, error or aborted, with its reasons. Exit code
    0 when every drill passed, 1 when a drill failed (a criterion broken, a fault left behind),
    2 on bad input, an unreachable target or a drill the tool could not run, 3 when a drill was
    inconclusive and none failed, 130 when interrupted (rollbacks still played).
    """
    from chaoslib_infer.gameday import default_k8s_plan_path, default_plan_path
    from chaoslib_infer.plan import load_plan

    try:
        the_plan = load_plan(
            plan or (default_k8s_plan_path() if opts.k8s_file else default_plan_path())
        )
    except InferChaosError as exc:
        fail(str(exc))
        return
    apply_gateway(the_plan, gateway, gateway_config)
    apply_load_vars(the_plan, load_vars or {})
    run_plan(the_plan, out_dir, opts)
