"""``chaos-infer``: the command line of chaoslib-infer (thin: parse, call the library, print, exit).

Exit codes everywhere: 0 success / every hypothesis held, 1 a drill deviated, 2 bad input or
unreachable target (one clear line on stderr, no traceback), 130 interrupted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from chaoslib_infer import __version__
from chaoslib_infer.errors import ConfigError, InferChaosError

DEFAULT_LAB_DIR = Path(".chaos-infer/lab")


def _fail(msg: str, code: int = 2) -> None:
    click.echo(f"chaos-infer: error: {msg}", err=True)
    sys.exit(code)


def prepare_out_dir(path: Path, create: bool = True) -> None:
    """Check (and with ``create``, make) an evidence folder before anything runs.

    Args:
        path: the ``--out`` folder.
        create: make it (and its parents); False only checks it is not an existing file.

    Raises:
        ConfigError: the path is an existing non-folder, or the folder cannot be made.
    """
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {path}: exists and is not a folder")
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise ConfigError(f"--out {path}: cannot create it: {exc.strerror or exc}") from None


def _parse_criteria(
    plan: Any, items: tuple[str, ...]
) -> list[tuple[str | None, str, float | None]]:
    """``--criterion [DRILL:]NAME=VALUE`` items, checked against the plan's drills.

    Raises:
        ConfigError: malformed item, unknown drill or criterion.
    """
    from chaoslib_infer.gameday import cli_criteria
    from chaoslib_infer.verdict import parse_override

    out = []
    for item in items:
        try:
            out.append(parse_override(item))
        except ValueError as exc:
            raise ConfigError(f"--criterion: {exc}") from None
    cli_criteria(plan, out)  # refuses unknown drills and criteria now, before anything starts
    return out


def _parse_slo(values: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in values:
        key, sep, val = item.partition("=")
        if not sep:
            raise ConfigError(f"--slo {item!r}: expected METRIC=VALUE, e.g. p99_e2e_s=0.5")
        try:
            out[key.strip()] = float(val)
        except ValueError as exc:
            raise ConfigError(f"--slo {item!r}: {val!r} is not a number") from exc
    from chaoslib_infer.activities.slo import thresholds_from

    try:
        thresholds_from(out)
    except ValueError as exc:
        raise ConfigError(f"--slo: {exc}") from exc
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="chaos-infer")
def main() -> None:
    """Chaos and disaster-recovery drills for LLM inference services.

    \b
    Start here:
      chaos-infer gameday --out gameday-out     bring up the local lab, run the default
                                                game day (drills/gameday.yaml), take it down
      chaos-infer lab up --replicas 3           keep a lab running to drive it by hand or
      chaos --no-version-check run experiments/oom-kill.yaml    with the Chaos Toolkit CLI
      chaos-infer capacity --peak-qps 200 --latency-s 1 --concurrency 20 --redundancy 0.7

    Evidence (summary.json, index.html, per-drill evidence.md/.html with a timeline plot, the
    Chaos Toolkit journal and one record per request) lands in the --out folder.
    """
    import os

    os.umask(0o077)  # run files hold server text: 0600 files, 0700 folders (docs/safety.md)


def _experiments_dir() -> Path:
    """The drills' experiments: ``$CHAOS_INFER_EXPERIMENTS`` or the checkout's ``experiments/``."""
    import os

    env = os.environ.get("CHAOS_INFER_EXPERIMENTS")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "experiments"


def _k8s_target_file(value: str | None) -> Path | None:
    """``--target`` naming a ``*.yaml``/``*.yml`` file (not a URL): a Kubernetes target file."""
    if value and "://" not in value and value.lower().endswith((".yaml", ".yml")):
        return Path(value)
    return None


def _check_k8s(the_plan: Any, k8s_file: Path | None, target_url: str | None, lab_opts: bool) -> Any:
    """The Kubernetes target of a run (allowlist checked, no API call), or None for a lab/URL run.

    Raises:
        ConfigError: a lab plan with a target file, a Kubernetes plan without one (or with a
            URL), lab options, or a target file that is malformed or outside its allowlist.
    """
    from chaoslib_infer.platforms.kubernetes.target import load_target

    if the_plan.platform != "kubernetes":
        if k8s_file is not None:
            raise ConfigError(
                f"{the_plan.path}: this plan runs against the local lab; a Kubernetes target "
                "needs a plan with platform: kubernetes (default drills/gameday-k8s.yaml)"
            )
        return None
    if k8s_file is None and target_url:
        raise ConfigError(
            f"{the_plan.path}: a Kubernetes plan needs --target TARGET.yaml (a target file), "
            f"not a URL ({target_url})"
        )
    k8s_file = k8s_file or the_plan.target
    if k8s_file is None:
        raise ConfigError(
            f"{the_plan.path}: a Kubernetes plan: give --target TARGET.yaml (docs/kubernetes.md)"
        )
    if lab_opts:
        raise ConfigError("--replicas and --engine apply to the local lab, not to a cluster")
    try:
        return load_target(k8s_file, plan_path=the_plan.path)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{k8s_file}: not UTF-8 text (byte {exc.start})") from None


def _print_dry_run(
    the_plan: Any,
    target_url: str | None,
    replicas: int | None,
    engine: str | None,
    overrides: dict[str, float] | None = None,
    k8s: Any = None,
) -> None:
    import yaml

    click.echo(f"plan {the_plan.name} ({the_plan.path})")
    if k8s is not None:
        from chaoslib_infer.platforms.kubernetes.target import _resolve_context

        context = k8s.context or _resolve_context(k8s.kubeconfig) or "in-cluster"
        click.echo(
            f"target: kubernetes ({k8s.source}): context {context}, namespace {k8s.namespace}, "
            f"pods {k8s.selector}, container {k8s.container}; traffic to {k8s.url}"
        )
    elif target_url:
        click.echo(f"target: {target_url}")
    else:
        lab = the_plan.lab
        extra = "".join(f", {k}={v}" for k, v in lab.options.items())
        click.echo(
            f"target: local lab, {replicas or lab.replicas} x {engine or lab.engine} replicas, "
            f"{lab.memory_limit_mb} MiB memory cgroup each, behind "
            f"{lab.options.get('gateway') or 'haproxy'}{extra}"
        )
    import dataclasses

    from chaoslib_infer.activities.slo import thresholds_from

    slo = thresholds_from(overrides or {})
    click.echo(
        "SLOs (steady-state hypothesis): "
        + ", ".join(f"{f.name}={getattr(slo, f.name)}" for f in dataclasses.fields(slo))
    )
    for d in the_plan.drills:
        exp = yaml.safe_load(d.experiment.read_text(encoding="utf-8"))
        click.echo(f"- drill {d.name}: {exp.get('title', '')}")
        for act in exp.get("method", []):
            pauses = act.get("pauses") or {}
            extra = f" (then wait {pauses['after']} s)" if pauses.get("after") else ""
            args = (act.get("provider") or {}).get("arguments") or {}
            click.echo(f"    {act.get('type')}: {act.get('name')} {args}{extra}")
        for rb in exp.get("rollbacks", []):
            click.echo(f"    rollback: {rb.get('name')}")
    click.echo("dry run: nothing was started or changed")


def _run_plan(
    the_plan: Any,
    out_dir: Path,
    target_url: str | None,
    replicas: int | None,
    engine: str | None,
    slo: tuple[str, ...],
    dry_run: bool,
    allow: tuple[str, ...] = (),
    api_key_file: Path | None = None,
    k8s_file: Path | None = None,
    criterion: tuple[str, ...] = (),
) -> None:
    """Check everything that can be checked without touching anything, then run (or dry-run).

    Refused with one line and exit 2, before anything starts: a target outside the allowlist
    (a URL, or a Kubernetes target file's context/namespace: no API call is made), a
    malformed --allow/--slo/stop condition, an experiment that does not load (named), an
    unreadable API key file; on a real run also an unreachable target and, on Kubernetes, a
    node-level drill whose node runs pods of other namespaces
    (:func:`chaoslib_infer.safety.k8s_preflight.check_plan`).
    """
    import os

    from chaoslib_infer.gameday import run_gameday, validate_plan
    from chaoslib_infer.safety import redact
    from chaoslib_infer.safety.allowlist import allow_patterns, check_target

    k8s = None
    try:
        k8s = _check_k8s(the_plan, k8s_file, target_url, bool(replicas or engine))
        if k8s is not None:
            target_url = None
        overrides = _parse_slo(slo)
        criteria = _parse_criteria(the_plan, criterion)
        allow_patterns(allow, the_plan.path)
        if target_url:
            check_target(target_url, allow, the_plan.path)
        if k8s is not None:  # the file's url: allowed by the operator's patterns, not by itself
            check_target(k8s.url, allow, the_plan.path, what=f"{k8s.source}: url")
        if api_key_file is not None:
            try:
                key = redact.read_key_file(api_key_file)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            # the load generator inherits it; never on a command line
            os.environ[redact.API_KEY_ENV] = key
        validate_plan(the_plan)  # after the key: experiments may reference $CHAOS_INFER_API_KEY
        prepare_out_dir(out_dir, create=False)
    except InferChaosError as exc:
        _fail(str(exc))
        return
    if dry_run:
        _print_dry_run(the_plan, target_url, replicas, engine, overrides, k8s)
        return
    try:
        if k8s is not None:  # one cheap API call: unreachable/forbidden refuses before any load
            from chaoslib_infer.platforms.kubernetes.target import preflight

            preflight(k8s)
            from chaoslib_infer.safety.k8s_preflight import check_plan

            check_plan(the_plan, k8s)  # a shared node: refused here, before any load (exit 2)
        elif target_url:  # TCP connect + one GET: an unreachable URL refuses before any load
            from chaoslib_infer.gameday import preflight_url

            preflight_url(target_url)
        prepare_out_dir(out_dir)
        code = run_gameday(
            the_plan,
            out_dir,
            base_url=target_url,
            replicas=replicas,
            engine=engine,
            slo_overrides=overrides,
            progress=lambda m: click.echo(m),
            allow=allow,
            k8s_target=k8s,
            criteria=criteria,
        )
    except InferChaosError as exc:
        _fail(str(exc))
        return
    sys.exit(code)


_TARGET_OPTIONS = [
    click.option(
        "--target",
        "target_url",
        default=None,
        metavar="URL|FILE",
        help="Run against this OpenAI-compatible URL instead of bringing up the lab "
        "(drills that need lab access then fail), or against a Kubernetes cluster named by a "
        "target FILE (*.yaml: context, namespace, pods, url, allowlist; docs/kubernetes.md): "
        "then the Kubernetes drills (experiments/k8s/, plan drills/gameday-k8s.yaml) run.",
    ),
    click.option(
        "--replicas",
        type=click.IntRange(1, 16),
        default=None,
        help="Lab replicas (default: from the plan).",
    ),
    click.option(
        "--engine",
        type=click.Choice(["sim", "llama-cpp"]),
        default=None,
        help="Lab engine: simulated vLLM-shaped server, or a real llama.cpp server on a tiny model.",
    ),
    click.option(
        "--slo",
        multiple=True,
        metavar="METRIC=VALUE",
        help="Override an acceptance threshold, e.g. --slo p99_e2e_s=0.5 (repeatable). Metrics: "
        "availability, error_rate, timeout_rate, p50_e2e_s, p95_over_p50, p99_e2e_s.",
    ),
    click.option(
        "--criterion",
        multiple=True,
        metavar="[DRILL:]NAME=VALUE",
        help="Override a drill criterion's threshold, e.g. --criterion restart_s=20 or "
        "--criterion network-jitter:duplicate_generations=2 (repeatable); VALUE 'off' shows "
        "the row as 'not judged'. Names and defaults: docs/definitions.md, 'Drill criteria'.",
    ),
    click.option(
        "--dry-run",
        is_flag=True,
        help="Print the plan (drills, faults, rollbacks) and touch nothing.",
    ),
    click.option(
        "--allow",
        multiple=True,
        metavar="PATTERN",
        help="Allow --target URLs matching SCHEME://HOST[:PORT] (host may be a glob or a CIDR, "
        "port '*'); repeatable. Default allowlist: loopback only. Also $CHAOS_INFER_ALLOW and "
        "the plan's allow: list.",
    ),
    click.option(
        "--api-key-file",
        type=click.Path(path_type=Path, dir_okay=False),
        default=None,
        help="File holding the target's API key (sent as Authorization: Bearer). Default: "
        "$CHAOS_INFER_API_KEY. The key is passed through the environment, never on a command "
        "line, and scrubbed from every file the run writes.",
    ),
]


def _target_options(func: Any) -> Any:
    for option in reversed(_TARGET_OPTIONS):
        func = option(func)
    return func


_GATEWAY_CHOICE = click.Choice(["haproxy", "nginx", "litellm"])
_GATEWAY_HELP = (
    "The lab's gateway on its URL: haproxy (the lab's settings), nginx (Debian's, with "
    "--gateway-config or the project's default); docs/gateways.md."
)
_GATEWAY_CONFIG_HELP = (
    "The gateway's config: a full nginx.conf, server blocks or a location snippet (a Jinja2 "
    "template over the lab's replicas: {{ upstream }}, {{ servers }}, {{ listen }}, "
    "{{ lab_http }}); docs/gateways.md."
)


def _gateway_options(func: Any) -> Any:
    """``--gateway`` / ``--gateway-config`` of gameday and drill run (override the plan's lab:)."""
    func = click.option(
        "--gateway-config",
        type=click.Path(path_type=Path, dir_okay=False, exists=True),
        default=None,
        help=_GATEWAY_CONFIG_HELP,
    )(func)
    return click.option("--gateway", type=_GATEWAY_CHOICE, default=None, help=_GATEWAY_HELP)(func)


def _apply_gateway(the_plan: Any, gateway: str | None, gateway_config: Path | None) -> None:
    """Put ``--gateway`` / ``--gateway-config`` into the plan's ``lab:`` options."""
    if gateway is not None:
        the_plan.lab.options["gateway"] = gateway
        if gateway == "haproxy":
            the_plan.lab.options.pop("gateway_config", None)
    if gateway_config is not None:
        the_plan.lab.options["gateway_config"] = str(gateway_config.resolve())


@main.command()
@click.argument("plan", required=False, type=click.Path(path_type=Path))
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=Path("gameday-out"),
    show_default=True,
    help="Folder for the evidence bundle.",
)
@_target_options
@_gateway_options
def gameday(
    plan: Path | None,
    out_dir: Path,
    target_url: str | None,
    replicas: int | None,
    engine: str | None,
    slo: tuple[str, ...],
    criterion: tuple[str, ...],
    dry_run: bool,
    allow: tuple[str, ...],
    api_key_file: Path | None,
    gateway: str | None = None,
    gateway_config: Path | None = None,
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

    k8s_file = _k8s_target_file(target_url)
    try:
        the_plan = load_plan(plan or (default_k8s_plan_path() if k8s_file else default_plan_path()))
    except InferChaosError as exc:
        _fail(str(exc))
        return
    _apply_gateway(the_plan, gateway, gateway_config)
    _run_plan(
        the_plan,
        out_dir,
        target_url,
        replicas,
        engine,
        slo,
        dry_run,
        allow,
        api_key_file,
        k8s_file,
        criterion,
    )


@main.group()
def drill() -> None:
    """List the drills, or run one of them on its own (with the default plan's lab)."""


@drill.command("list")
def drill_list() -> None:
    """One line per drill: name and what it checks."""
    import yaml

    for path in sorted(_experiments_dir().glob("*.yaml")):
        try:
            title = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("title", "")
        except yaml.YAMLError:
            title = "(unreadable experiment)"
        click.echo(f"{path.stem:24} {title}")


@drill.command("run")
@click.argument("name")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder for the evidence bundle (default: drill-out/NAME).",
)
@_target_options
@_gateway_options
def drill_run(
    name: str,
    out_dir: Path | None,
    target_url: str | None,
    replicas: int | None,
    engine: str | None,
    slo: tuple[str, ...],
    criterion: tuple[str, ...],
    dry_run: bool,
    allow: tuple[str, ...],
    api_key_file: Path | None,
    gateway: str | None = None,
    gateway_config: Path | None = None,
) -> None:
    """Run the drill NAME (see `chaos-infer drill list`) alone, with evidence, like a game day.

    With --target TARGET.yaml (a Kubernetes target file) it runs experiments/k8s/NAME.yaml.
    """
    from chaoslib_infer.gameday import default_k8s_plan_path, default_plan_path
    from chaoslib_infer.plan import DrillSpec, Plan, load_plan

    k8s_file = _k8s_target_file(target_url)
    folder = _experiments_dir() / "k8s" if k8s_file else _experiments_dir()
    experiment = folder / f"{name}.yaml"
    if not experiment.is_file():
        known = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
        _fail(f"unknown drill {name!r}; known: {known}")
        return
    try:
        base = load_plan(default_k8s_plan_path() if k8s_file else default_plan_path())
    except InferChaosError as exc:
        _fail(str(exc))
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
    )
    _apply_gateway(the_plan, gateway, gateway_config)
    _run_plan(
        the_plan,
        out_dir or Path("drill-out") / name,
        target_url,
        replicas,
        engine,
        slo,
        dry_run,
        allow,
        api_key_file,
        k8s_file,
        criterion,
    )


@main.group()
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
@click.option(
    "--gateway", type=_GATEWAY_CHOICE, default="haproxy", show_default=True, help=_GATEWAY_HELP
)
@click.option(
    "--gateway-config",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=None,
    help=_GATEWAY_CONFIG_HELP,
)
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
    from chaoslib_infer.safety.ledger import refuse_if_pending

    try:
        kwargs = lab_up_kwargs(ctx, plan_path, options)
        refuse_if_pending(state_dir)  # faults left by a killed run: `chaos-infer rollback` first
        the_lab = Lab.up(state_dir, **kwargs)
    except (LabError, InferChaosError) as exc:
        _fail(str(exc))
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
    from chaoslib_infer.lab.fleet import Lab, LabError
    from chaoslib_infer.safety.ledger import pending_faults

    try:
        the_lab = Lab.attach(state_dir)
        pending_faults(state_dir)  # an unreadable ledger is never shown as "0 faults": exit 2
        status = the_lab.status()
    except LabError as exc:
        _fail(str(exc))
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


@lab.command("down")
@click.option(
    "--state-dir", type=click.Path(path_type=Path), default=DEFAULT_LAB_DIR, show_default=True
)
def lab_down(state_dir: Path) -> None:
    """Stop every lab process and remove its cgroups and namespaces (idempotent: with no lab in
    STATE_DIR there is nothing to do and it exits 0)."""
    from chaoslib_infer.lab.fleet import LAB_FILE, Lab, LabError

    if not (state_dir / LAB_FILE).exists():
        click.echo(f"no lab in {state_dir}: nothing to take down")
        return
    try:
        Lab.attach(state_dir).down()
    except LabError as exc:
        _fail(str(exc))
        return
    click.echo("lab down")


@main.command()
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
    from chaoslib_infer.safety.ledger import describe, pending_faults
    from chaoslib_infer.safety.ledger import rollback as do_rollback
    from chaoslib_infer.safety.registry import LedgerRefused, validate

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
    from chaoslib_infer.safety.k8s_replay import replay

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


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--runbooks",
    "runbooks_path",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Also fill the Evidence section of the runbooks in this folder (e.g. runbooks/) "
    "from RUN_DIR, so each runbook carries its latest proof.",
)
def report(run_dir: Path, runbooks_path: Path | None) -> None:
    """Re-render the evidence (per-drill evidence, index.html, junit.xml, runbooks) of an
    existing game-day folder RUN_DIR, including one whose runner was killed mid-drill."""
    from chaoslib_infer.evidence.runbooks import fill_runbooks
    from chaoslib_infer.gameday import report_run

    try:
        code = report_run(run_dir, progress=lambda m: click.echo(m))
        if runbooks_path is not None:
            written = fill_runbooks(run_dir, runbooks_path)
            click.echo(f"runbooks filled: {', '.join(sorted(written)) or 'none'}")
    except InferChaosError as exc:
        _fail(str(exc))
        return
    except (OSError, ValueError) as exc:
        _fail(f"{runbooks_path}: {exc}")
        return
    sys.exit(code)


@main.command()
@click.option(
    "--peak-qps", type=float, required=True, help="Peak requests/s of the busiest 10 minutes."
)
@click.option("--latency-s", type=float, required=True, help="Expected latency per request (s).")
@click.option(
    "--concurrency", type=float, required=True, help="Max concurrent requests one instance serves."
)
@click.option(
    "--redundancy",
    type=float,
    default=0.7,
    show_default=True,
    help="Redundancy factor (target utilisation, 0..1).",
)
def capacity(peak_qps: float, latency_s: float, concurrency: float, redundancy: float) -> None:
    """Instances needed: ceil(peak_QPS x latency_s / concurrency / redundancy).

    Worked example (docs/definitions.md): 200 QPS x 1 s / 20 / 0.7 = 14.28, so 15 instances.
    """
    from chaoslib_infer.capacity import plan

    try:
        cap = plan(peak_qps, latency_s, concurrency, redundancy)
    except ValueError as exc:
        _fail(f"capacity: {exc}")
        return
    click.echo(cap.describe())
    click.echo(
        f"autoscaler minimum ~60%: {cap.autoscaler_min}; acceptance load 1.5x peak: {cap.acceptance_qps:g} QPS"
    )
    click.echo(str(cap.instances))


@main.command()
@click.option(
    "--target-p99",
    "target_p99_s",
    type=float,
    default=10.0,
    show_default=True,
    metavar="S",
    help="P99 latency target (s); the alert fires at 1.5x it for 5 min.",
)
@click.option(
    "--target-mean",
    "target_mean_s",
    type=float,
    default=2.0,
    show_default=True,
    metavar="S",
    help="Mean response time target (s); the alert fires above it for 10 min.",
)
@click.option(
    "--servable-concurrency",
    type=float,
    default=20.0,
    show_default=True,
    help="Requests one instance serves at once (vLLM --max-num-seqs): queue-depth threshold.",
)
@click.option(
    "--selector",
    default="",
    metavar="MATCHERS",
    help='Extra label matchers for the inference metrics, e.g. \'namespace="llm",job="vllm"\'.',
)
@click.option(
    "--rate-window",
    default="2m",
    show_default=True,
    help="Window of every rate(); at least two scrape intervals.",
)
@click.option("--namespace", default=None, help="Namespace of the PrometheusRule object.")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("alerts"),
    show_default=True,
    help="Folder for alert-rules.yaml (plain) and prometheusrule.yaml (Prometheus Operator).",
)
def alerts(
    target_p99_s: float,
    target_mean_s: float,
    servable_concurrency: float,
    selector: str,
    rate_window: str,
    namespace: str | None,
    out_dir: Path,
) -> None:
    """Write the alert table of docs/definitions.md as Prometheus rules (vLLM, DCGM,
    node_exporter and kube-state-metrics names); check them with `promtool check rules`."""
    from chaoslib_infer.prometheus import AlertConfig, alert_specs, write_alerts

    cfg = AlertConfig(
        target_p99_s=target_p99_s,
        target_mean_s=target_mean_s,
        servable_concurrency=servable_concurrency,
        selector=selector,
        rate_window=rate_window,
        namespace=namespace,
    )
    try:
        specs = alert_specs(cfg)
        plain, operator_rule = write_alerts(out_dir, cfg)
    except (ValueError, OSError) as exc:
        _fail(f"alerts: {exc}")
        return
    for s in specs:
        click.echo(f"{s.alert:28} {s.layer:10} {s.signal} {s.op} {s.threshold:g} for {s.for_}")
    click.echo(f"wrote {plain} and {operator_rule}")


@main.command()
@click.option(
    "--cron",
    required=True,
    metavar="EXPR",
    help="CronJob schedule: 5 fields 'minute hour day-of-month month day-of-week' (cluster "
    "time zone), e.g. '0 3 * * 1' = Mondays 03:00; or @daily, @weekly...",
)
@click.option(
    "--plan",
    "plan_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Plan with platform: kubernetes (default drills/gameday-k8s.yaml).",
)
@click.option(
    "--target",
    "target_file",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Kubernetes target file (its allowlist is checked now).",
)
@click.option(
    "--image",
    default=f"chaoslib-infer:{__version__}",
    show_default=True,
    help="Image with this package (build it from the Dockerfile, push it where the cluster "
    "pulls from).",
)
@click.option(
    "--namespace",
    default="chaos-infer",
    show_default=True,
    help="Namespace of the ServiceAccount, ConfigMap and CronJob.",
)
@click.option("--name", default="chaos-infer-gameday", show_default=True, help="CronJob name.")
@click.option(
    "--deadline-s",
    type=int,
    default=3600,
    show_default=True,
    help="activeDeadlineSeconds of each run.",
)
@click.option(
    "--evidence-pvc",
    default=None,
    metavar="CLAIM",
    help="PersistentVolumeClaim for /evidence (default: emptyDir, gone with the pod).",
)
@click.option(
    "--api-key-secret",
    default=None,
    metavar="SECRET",
    help="Secret whose key 'api-key' is the target's API key ($CHAOS_INFER_API_KEY).",
)
@click.option(
    "--out",
    "out_file",
    default="-",
    show_default=True,
    metavar="FILE|-",
    help="Where the YAML goes (- : stdout).",
)
def schedule(
    cron: str,
    plan_path: Path | None,
    target_file: Path,
    image: str,
    namespace: str,
    name: str,
    deadline_s: int,
    evidence_pvc: str | None,
    api_key_secret: str | None,
    out_file: str,
) -> None:
    """Write a recurring game day as Kubernetes objects: ServiceAccount and RBAC (from
    deploy/rbac.yaml), a ConfigMap with the plan, target and experiments, and a CronJob running
    `chaos-infer gameday` from the project's image. Apply it with `kubectl apply -f FILE`.

    Nothing is sent to the cluster. Exit 2 (one line) on a bad cron expression, a plan that is
    not for Kubernetes, or a target outside its allowlist.
    """
    from chaoslib_infer.gameday import default_k8s_plan_path
    from chaoslib_infer.schedule import ScheduleSpec, build_schedule, dump_documents

    spec = ScheduleSpec(
        cron=cron,
        plan=plan_path or default_k8s_plan_path(),
        target=target_file,
        image=image,
        namespace=namespace,
        name=name,
        deadline_s=deadline_s,
        evidence_pvc=evidence_pvc,
        api_key_secret=api_key_secret,
    )
    try:
        docs = build_schedule(spec)
    except InferChaosError as exc:
        _fail(str(exc))
        return
    except UnicodeDecodeError as exc:  # the --plan or --target file
        _fail(f"--plan/--target: a file is not UTF-8 text (byte {exc.start})")
        return
    text = dump_documents(
        docs,
        f"chaos-infer {__version__} schedule --cron '{docs[-1]['spec']['schedule']}': "
        f"plan {spec.plan.name}, target {target_file.name}\napply: kubectl apply -f THIS_FILE",
    )
    if out_file == "-":
        click.echo(text, nl=False)
        return
    try:
        Path(out_file).write_text(text, encoding="utf-8")
    except OSError as exc:
        _fail(f"--out {out_file}: {exc.strerror or exc}")
        return
    kinds = ", ".join(d["kind"] for d in docs)
    click.echo(f"wrote {out_file}: {kinds}; apply with: kubectl apply -f {out_file}", err=True)


@main.command()
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
def certify(
    targets: tuple[Path, ...],
    out_dir: Path,
    plan_path: Path | None,
    quick: bool,
    scale: float,
    soak_s: float | None,
    allow: tuple[str, ...],
    dry_run: bool,
) -> None:
    """Certify inference providers side by side: three-phase load test, soak, client-side faults.

    Exit code 0 when every target is certified, 1 when one is not, 2 on bad input or an
    unreachable target, 130 when interrupted. See docs/certification.md.
    """
    from chaoslib_infer.certify import certify_command

    try:
        prepare_out_dir(out_dir, create=not dry_run)
    except ConfigError as exc:
        _fail(str(exc))
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
        )  # fmt: skip
    except UnicodeDecodeError as exc:  # a --target or --plan file
        _fail(f"--target/--plan: a file is not UTF-8 text (byte {exc.start})")
        return
    sys.exit(code)


from chaoslib_infer.load.commands import load_group  # noqa: E402 - `chaos-infer load ...`

main.add_command(load_group)

if __name__ == "__main__":
    main()
