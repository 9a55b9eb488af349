"""``chaos-infer lab up|status|down``: the local lab by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from chaoslib_infer.errors import ConfigError, InferChaosError

from .common import DEFAULT_LAB_DIR, fail, gateway_options
from .usage import OneLineGroup

__all__ = ["describe_engine_fault", "lab", "lab_down", "lab_status", "lab_up", "lab_up_kwargs"]


@click.group(cls=OneLineGroup)
def lab() -> None:
    """Bring the local lab up, inspect it, take it down.

    The lab is N simulated vLLM-compatible engine replicas (or llama.cpp servers), each a real process
    supervised by supervisord in its own memory cgroup, behind HAProxy on loopback.
    """


@lab.command("up")
@click.option(
    "--plan",
    "plan_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Bring up the lab of this plan's lab: block (e.g. drills/gameday.yaml: the game day's "
    "lab); options given here override it.",
)
@click.option("--replicas", type=click.IntRange(1, 32), default=3, show_default=True)
@click.option("--engine", type=click.Choice(["sim", "llama-cpp"]), default="sim", show_default=True)
@click.option(
    "--memory-limit-mb",
    type=click.IntRange(32, 65536),
    default=512,
    show_default=True,
    help="Memory cgroup limit of each replica.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8800,
    show_default=True,
    help="HAProxy frontend port on 127.0.0.1 (0: any free port).",
)
@click.option(
    "--nodes",
    type=click.IntRange(0, 16),
    default=0,
    show_default=True,
    help="Spread the replicas over N nodes, each its own network namespace (0: all on loopback).",
)
@click.option(
    "--spare-node/--no-spare-node",
    default=True,
    show_default=True,
    help="With --nodes: add one empty spare node that lost replicas are rescheduled onto.",
)
@click.option(
    "--standby",
    type=click.IntRange(0, 31),
    default=0,
    show_default=True,
    help="Standby replicas: configured but not started (the autoscaler or a drill starts them).",
)
@click.option(
    "--autoscale/--no-autoscale",
    default=False,
    show_default=True,
    help="Run the queue-depth scale-out policy over the standby replicas (needs --standby).",
)
@click.option(
    "--scale-out-queue",
    type=float,
    default=4.0,
    show_default=True,
    help="Autoscaler: queue depth (requests waiting in HAProxy and the engines) that counts as "
    "overload.",
)
@click.option(
    "--scale-out-after-s",
    type=float,
    default=1.0,
    show_default=True,
    help="Autoscaler: seconds the queue depth must stay above --scale-out-queue.",
)
@click.option(
    "--scale-out-cooldown-s",
    type=float,
    default=10.0,
    show_default=True,
    help="Autoscaler: seconds between two scale-outs.",
)
@click.option(
    "--gateway-retry/--no-gateway-retry",
    default=False,
    show_default=True,
    help="HAProxy retries a refused or 503 request on another replica and ejects a replica at "
    "its first connection error (default: health checks alone).",
)
@gateway_options(default="haproxy", show_default=True)
@click.option(
    "--engine-arg",
    "engine_arg",
    multiple=True,
    metavar="KEY=VALUE",
    help="Engine option, e.g. --engine-arg max_num_seqs=4 (repeatable; the plan's engine_args; "
    "sim: the flags of python -m chaoslib_infer.lab.engine, VALUE read as YAML: 4, 0.5, true).",
)
@click.option(
    "--ready-timeout-s",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds to wait until every replica serves.",
)
@click.option(
    "--state-dir", type=click.Path(path_type=Path), default=DEFAULT_LAB_DIR, show_default=True
)
@click.pass_context
def lab_up(ctx: click.Context, plan_path: Path | None, state_dir: Path, **options: Any) -> None:
    """Start the lab and wait until every replica is ready.

    Every field of a plan's lab: block has an option here (or take them all with --plan), so
    `lab up --plan drills/gameday.yaml` keeps the game day's lab running to drive it by hand.
    """
    from chaoslib_infer.lab.fleet import Lab, LabError
    from chaoslib_infer.lab.ledger import refuse_if_pending

    try:
        kwargs = lab_up_kwargs(ctx, plan_path, options)
        refuse_if_pending(state_dir)  # faults left by a killed run: `chaos-infer rollback` first
        the_lab = Lab.up(state_dir, **kwargs)
    except (LabError, InferChaosError) as exc:
        fail(str(exc))
        return
    nodes = int(kwargs.get("nodes") or 0)
    spare = kwargs.get("spare_node") is not False
    where = f" on {nodes} node(s){' + 1 spare' if spare else ''}" if nodes else ""
    extra = "".join(
        f", {k}={v}"
        for k, v in kwargs.items()
        if k not in ("replicas", "engine", "nodes", "spare_node", "port")
    )
    click.echo(
        f"lab up: {the_lab.url} ({kwargs['replicas']} x {kwargs['engine']}{where}{extra}); "
        f"state in {state_dir}"
    )
    click.echo(
        f"try: curl -s {the_lab.url}/v1/models ; chaos-infer lab status ; chaos-infer lab down"
    )


#: ``lab up`` options that are ``Lab.up`` keyword arguments under the same name
_LAB_UP_OPTIONS = (
    "replicas",
    "engine",
    "memory_limit_mb",
    "port",
    "nodes",
    "spare_node",
    "standby",
    "autoscale",
    "scale_out_queue",
    "scale_out_after_s",
    "scale_out_cooldown_s",
    "gateway_retry",
    "ready_timeout_s",
    "gateway",
    "gateway_config",
)


def lab_up_kwargs(
    ctx: click.Context, plan_path: Path | None, options: dict[str, Any]
) -> dict[str, Any]:
    """``Lab.up`` keyword arguments of ``lab up``: the plan's ``lab:`` block, then the options.

    An option given on the command line overrides the plan; one left at its default does not.
    ``--engine-arg`` entries are merged into the plan's ``engine_args`` (the command line wins).

    Args:
        ctx: the click context of ``lab up`` (tells given options from defaults).
        plan_path: ``--plan`` or None.
        options: the ``lab up`` options (``_LAB_UP_OPTIONS`` plus ``engine_arg``).

    Returns:
        Keyword arguments for :meth:`chaoslib_infer.lab.fleet.Lab.up` (no ``state_dir``).

    Raises:
        ConfigError: a malformed plan, or a malformed ``--engine-arg`` (one line).
    """
    from click.core import ParameterSource

    kwargs: dict[str, Any] = {}
    engine_args: dict[str, Any] = {}
    if plan_path is not None:
        from chaoslib_infer.plan import load_plan

        the_plan = load_plan(plan_path)
        if the_plan.platform != "lab":
            raise ConfigError(f"{plan_path}: platform {the_plan.platform} has no lab to bring up")
        kwargs.update(
            replicas=the_plan.lab.replicas,
            engine=the_plan.lab.engine,
            memory_limit_mb=the_plan.lab.memory_limit_mb,
        )
        kwargs.update({k: v for k, v in the_plan.lab.options.items() if k != "engine_args"})
        plan_engine_args = the_plan.lab.options.get("engine_args") or {}
        if not isinstance(plan_engine_args, dict):
            raise ConfigError(f"{plan_path}: lab.engine_args: expected a mapping")
        engine_args.update(plan_engine_args)
    for name in _LAB_UP_OPTIONS:
        given = ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)
        if given or name not in kwargs:
            kwargs[name] = options[name]
    if not kwargs.get("nodes"):  # --spare-node only means something with nodes
        kwargs.pop("spare_node", None)
    engine_args.update(_parse_engine_args(options.get("engine_arg") or ()))
    if engine_args:
        kwargs["engine_args"] = engine_args
    return kwargs


def _parse_engine_args(values: tuple[str, ...]) -> dict[str, Any]:
    """``("max_num_seqs=4", "zero_latency=true")`` -> ``{"max_num_seqs": 4, "zero_latency": True}``.

    Raises:
        ConfigError: an entry without ``=``, a key that is not a flag name, or a VALUE that is
            not a YAML scalar.
    """
    import re

    import yaml

    out: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not re.fullmatch(r"[a-z][a-z0-9_]*", key):
            raise ConfigError(
                f"--engine-arg {item!r}: expected KEY=VALUE with KEY a flag name, e.g. "
                "max_num_seqs=4"
            )
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = None
        if isinstance(value, dict | list) or (value is None and raw.strip() not in ("null", "~")):
            raise ConfigError(f"--engine-arg {item!r}: VALUE must be a number, word or true/false")
        out[key] = value
    return out


@lab.command("status")
@click.option(
    "--state-dir", type=click.Path(path_type=Path), default=DEFAULT_LAB_DIR, show_default=True
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (replicas and active faults).")
def lab_status(state_dir: Path, as_json: bool) -> None:
    """Show replicas (pid, health, memory, OOM kills, restarts, engine faults armed on each, as
    the engine itself reports them) and the active faults of the lab's fault ledger."""
    from chaoslib_infer.lab.fleet import LAB_FILE, Lab, LabError
    from chaoslib_infer.lab.ledger import pending_faults

    if not (state_dir / LAB_FILE).exists():
        fail(f"no lab in {state_dir}; {OWN_LAB_HINT}")
        return
    try:
        the_lab = Lab.attach(state_dir)
        pending_faults(state_dir)  # an unreadable ledger is never shown as "0 faults": exit 2
        status = the_lab.status()
    except LabError as exc:
        fail(str(exc))
        return
    if as_json:
        click.echo(json.dumps(status, indent=2))
        return
    click.echo(
        f"lab {status.get('url')} engine={status.get('engine')} gateway={status.get('gateway', 'haproxy')}"
    )
    for r in status.get("replicas", []):
        mem = r.get("memory_bytes") or 0
        lim = r.get("memory_limit_bytes") or 0
        click.echo(
            f"  {r.get('name'):4} pid={r.get('pid')} state={r.get('state')} healthy={r.get('healthy')} "
            f"mem={mem / 2**20:.0f}/{lim / 2**20:.0f} MiB oom_kills={r.get('oom_kills')} "
            f"restarts={r.get('restarts')}"
        )
        if r.get("engine_faults_error"):
            click.echo(f"       engine faults: unknown ({r['engine_faults_error']})")
        for fault in r.get("engine_faults") or []:
            click.echo(f"       engine fault armed: {describe_engine_fault(fault)}")
    armed = sum(len(r.get("engine_faults") or []) for r in status.get("replicas", []))
    if status.get("engine") == "sim" and status.get("running"):
        click.echo(f"engine faults armed: {armed}")
    faults = status.get("active_faults") or []
    click.echo(f"active faults: {len(faults)}")
    for f in faults:
        click.echo(f"  {f}")


def describe_engine_fault(fault: dict[str, Any]) -> str:
    """One line for an armed engine fault (an entry of ``GET /admin/faults``), e.g.
    ``stall k=2 t=8.0 probability=0.5 (expires in 12.3 s, id 1a2b3c4d)``."""
    params = " ".join(
        f"{k}={fault[k]}" for k in ("k", "t", "n", "factor", "how") if fault.get(k) is not None
    )
    prob = fault.get("probability")
    text = " ".join(
        part
        for part in (
            str(fault.get("mode")),
            params,
            f"probability={prob:g}" if isinstance(prob, int | float) and prob != 1 else "",
        )
        if part
    )
    left = fault.get("expires_in_s")
    when = f"expires in {left:.1f} s" if isinstance(left, int | float) else "until cleared"
    return f"{text} ({when}, id {fault.get('id')})"


#: where a run's own lab is: ``gameday`` and ``drill run`` bring one up in their ``--out`` folder
OWN_LAB_HINT = (
    "a game day or drill run keeps its own lab in OUT/lab while it runs: --state-dir OUT/lab"
)


@lab.command("down")
@click.option(
    "--state-dir", type=click.Path(path_type=Path), default=DEFAULT_LAB_DIR, show_default=True
)
def lab_down(state_dir: Path) -> None:
    """Stop every lab process and remove its cgroups and namespaces (idempotent: with no lab in
    STATE_DIR there is nothing to do and it exits 0)."""
    from chaoslib_infer.lab.fleet import LAB_FILE, Lab, LabError

    if not (state_dir / LAB_FILE).exists():
        click.echo(f"no lab in {state_dir}: nothing to take down ({OWN_LAB_HINT})")
        return
    try:
        Lab.attach(state_dir).down()
    except LabError as exc:
        fail(str(exc))
        return
    click.echo("lab down")
