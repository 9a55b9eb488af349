"""``chaos-infer drill list|run``: the drills, one at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from chaoslib_infer.errors import InferChaosError

from .common import apply_gateway, experiments_dir, fail, gateway_options
from .load_settings import apply_load_vars, load_options
from .plan_run import PlanRunOptions, run_plan, target_options
from .usage import OneLineGroup

__all__ = ["drill"]


@click.group(cls=OneLineGroup)
def drill() -> None:
    """List the drills, or run one of them on its own (with the default plan's lab)."""


@drill.command("list")
def drill_list() -> None:
    """One line per drill: name and what it checks."""
    import yaml

    for name, path in sorted(_experiments(experiments_dir()).items()):
        try:
            title = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("title", "")
        except yaml.YAMLError:
            title = "(unreadable experiment)"
        click.echo(f"{name:24} {title}")


def _experiments(folder: Path, k8s: bool = False) -> dict[str, Path]:
    """``{drill name: experiment}`` in ``folder`` (the lab's experiments folder; with ``k8s``,
    the Kubernetes one under it): each registry drill whose experiment is there, at its
    registry path, and any other ``*.yaml`` of that folder by its stem (an operator's own)."""
    from chaoslib_infer.drills.registry import DRILLS

    what = "k8s_experiment" if k8s else "lab_experiment"
    known = {name: d.path_in(folder, what) for name, d in DRILLS.items()}
    found = {name: p for name, p in known.items() if p.is_file()}
    plain = folder / "k8s" if k8s else folder
    for path in plain.glob("*.yaml"):
        if path.stem not in known:
            found[path.stem] = path
    return found


@drill.command("run")
@click.argument("name")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder for the evidence bundle (default: drill-out/NAME).",
)
@target_options
@gateway_options()
@load_options
def drill_run(
    name: str,
    out_dir: Path | None,
    opts: PlanRunOptions,
    gateway: str | None = None,
    gateway_config: Path | None = None,
    load_vars: dict[str, Any] | None = None,
) -> None:
    """Run the drill NAME (see `chaos-infer drill list`) alone, with evidence, like a game day.

    With --target TARGET.yaml (a Kubernetes target file) it runs experiments/k8s/NAME.yaml.
    """
    from chaoslib_infer.gameday import default_k8s_plan_path, default_plan_path
    from chaoslib_infer.plan import DrillSpec, Plan, load_plan

    k8s_file = opts.k8s_file
    found = _experiments(experiments_dir(), k8s=k8s_file is not None)
    experiment = found.get(name)
    if experiment is None:
        known = ", ".join(sorted(found))
        fail(f"unknown drill {name!r}; known: {known}")
        return
    try:
        base = load_plan(default_k8s_plan_path() if k8s_file else default_plan_path())
    except InferChaosError as exc:
        fail(str(exc))
        return
    spec = next(
        (d for d in base.drills if d.name == name), DrillSpec(name=name, experiment=experiment)
    )
    the_plan = Plan(
        name=f"drill-{name}",
        path=experiment,
        lab=base.lab,
        drills=[spec],
        platform=base.platform,
        history=base.history,
    )
    apply_gateway(the_plan, gateway, gateway_config)
    apply_load_vars(the_plan, load_vars or {})
    run_plan(the_plan, out_dir or Path("drill-out") / name, opts, label=f"drill {name}")
