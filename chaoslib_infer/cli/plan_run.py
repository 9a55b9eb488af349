"""Running a plan from the command line, shared by ``gameday`` and ``drill run``.

The ``--target``/``--replicas``/``--engine``/``--slo``/``--criterion``/``--dry-run``/``--allow``/
``--api-key-file``/``--junit-inconclusive`` options (:func:`target_options`, handed to the command as one
:class:`PlanRunOptions`), their checks, the dry-run print-out and :func:`run_plan`, which refuses
bad input with one line and exit 2 before anything starts.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from chaoslib_infer.errors import ConfigError, InferChaosError
from chaoslib_infer.evidence.outdir import prepare_out_dir

from .common import fail, k8s_target_file, packed_options

__all__ = ["PlanRunOptions", "api_key_in_env", "check_k8s", "run_plan", "target_options"]


@dataclass(frozen=True)
class PlanRunOptions:
    """The options of a plan run (:func:`target_options`), as the operator gave them.

    Attributes:
        target_url: ``--target``: a URL, a Kubernetes target file (``*.yaml``), or None (the lab).
        replicas, engine: ``--replicas``, ``--engine`` (None: from the plan).
        slo, criterion: ``--slo METRIC=VALUE``, ``--criterion [DRILL:]NAME=VALUE`` items.
        dry_run: ``--dry-run``.
        allow: ``--allow`` patterns.
        api_key_file: ``--api-key-file``, or None.
        junit_inconclusive: ``--junit-inconclusive``: how ``junit.xml`` writes an inconclusive
            drill (``failure``, the default, or ``skipped``).
        verdict_policy: ``--verdict-policy``: ``default`` or ``strict`` for every drill (None:
            the plan's, :mod:`chaoslib_infer.verdict.policy`).
        prometheus: ``--prometheus URL``: read each drill's alerts from this server (None: the
            lab's own, :mod:`chaoslib_infer.evidence.detection`).
        rules: ``--rules FILE`` items: the team's rule files for the lab's Prometheus.
        history: ``--history``: the history store (None: ``$CHAOS_INFER_HISTORY``, the plan's
            ``history:``, else ``.chaos-infer/history.sqlite``; ``off``: none).
        fail_on_regression: ``--fail-on-regression``: exit 1 and a junit failure when the
            history comparison reads a drill ``regressed``.
    """

    target_url: str | None
    replicas: int | None
    engine: str | None
    slo: tuple[str, ...]
    criterion: tuple[str, ...]
    dry_run: bool
    allow: tuple[str, ...]
    api_key_file: Path | None
    junit_inconclusive: str = "failure"
    verdict_policy: str | None = None
    prometheus: str | None = None
    rules: tuple[Path, ...] = ()
    history: str | None = None
    fail_on_regression: bool = False

    @property
    def k8s_file(self) -> Path | None:
        """The Kubernetes target file ``--target`` names, or None."""
        return k8s_target_file(self.target_url)


def _parse_criteria(
    plan: Any, items: tuple[str, ...]
) -> list[tuple[str | None, str, float | None]]:
    """``--criterion [DRILL:]NAME=VALUE`` items, checked against the plan's drills.

    Raises:
        ConfigError: malformed item (an empty value, ``none``, a negative or non-numeric
            threshold), one criterion given twice in the same scope with different values,
            unknown drill or criterion.
    """
    from chaoslib_infer.drills.criterion import override_conflict
    from chaoslib_infer.gameday import cli_criteria
    from chaoslib_infer.verdict import parse_override

    out = []
    seen: dict[tuple[str | None, str], tuple[float | None, str]] = {}
    for item in items:
        try:
            drill, name, value = parse_override(item)
        except ValueError as exc:
            raise ConfigError(f"--criterion: {exc}") from None
        clash = override_conflict(seen, drill, name, value, item.partition("=")[2].strip())
        if clash:
            raise ConfigError(f"--criterion {clash}")
        out.append((drill, name, value))
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


def check_k8s(the_plan: Any, k8s_file: Path | None, target_url: str | None, lab_opts: bool) -> Any:
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
    out_dir: Path,
    target_url: str | None,
    replicas: int | None,
    engine: str | None,
    overrides: dict[str, float] | None = None,
    k8s: Any = None,
    criteria: list[tuple[str | None, str, float | None]] | None = None,
) -> None:
    import yaml

    click.echo(f"plan {the_plan.name} ({the_plan.path})")
    if k8s is not None:
        from chaoslib_infer.platforms.kubernetes.target import effective_context

        context = effective_context(k8s)
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
    from .dry_run_args import drill_configuration, resolve, unresolved_note

    lab_dir = out_dir / "lab" if not target_url and k8s is None else None
    for d in the_plan.drills:
        exp = yaml.safe_load(d.experiment.read_text(encoding="utf-8"))
        click.echo(f"- drill {d.name}: {exp.get('title', '')}")
        url, k8s_file = (k8s.url, str(Path(k8s.source).resolve())) if k8s else (target_url, None)
        config = drill_configuration(
            exp, d.vars, overrides or {}, out_dir / d.name, lab_dir, url, k8s_file
        )
        for act in exp.get("method", []):
            args, left = resolve((act.get("provider") or {}).get("arguments") or {}, config)
            pauses, left_p = resolve(act.get("pauses") or {}, config)
            extra = f" (then wait {pauses['after']} s)" if pauses.get("after") else ""
            note = unresolved_note(sorted({*left, *left_p}), exp)
            click.echo(f"    {act.get('type')}: {act.get('name')} {args}{extra}{note}")
        for rb in exp.get("rollbacks", []):
            click.echo(f"    rollback: {rb.get('name')}")
        _print_load_settings(exp, d.vars)
    _print_criteria(the_plan, criteria or [])
    _print_policy(the_plan, overrides or {})
    click.echo("dry run: nothing was started or changed")


def _print_load_settings(experiment: dict[str, Any], drill_vars: dict[str, Any]) -> None:
    """The drill's load settings in force, one line (the experiment's, under the plan's
    ``vars:`` and the ``--load-*`` options: ``controls.load.settings_in_force``)."""
    from chaoslib_infer.controls.load import settings_in_force
    from chaoslib_infer.load.options import setting_text

    try:
        values = settings_in_force(experiment, drill_vars)
    except ValueError as exc:  # validate_plan refused it already on a real run
        fail(str(exc))
        return
    if values is None:
        click.echo("    load: not the built-in background load (none, or a locustfile)")
        return
    click.echo("    load: " + " ".join(f"{k}={setting_text(k, v)}" for k, v in values.items()))


def _apply_policy(the_plan: Any, name: str | None, slo: dict[str, float]) -> None:
    """Set ``--verdict-policy`` (when given) on every drill of the plan, then check each drill's
    policy with the run's SLO (``--slo availability=``).

    Raises:
        ConfigError: a policy value refused (one line, naming the drill).
    """
    from chaoslib_infer.drill_run import drill_policy

    for spec in the_plan.drills:
        if name is not None:
            spec.verdict_policy = name
        drill_policy(spec, slo)


def _print_policy(the_plan: Any, slo: dict[str, float]) -> None:
    """The verdict policy in force, one line per drill."""
    from chaoslib_infer.drill_run import drill_policy

    click.echo("verdict policy (docs/definitions.md, 'Verdict policy'):")
    for spec in the_plan.drills:
        pol = drill_policy(spec, slo)
        click.echo(
            f"  {spec.name}: {pol.name}, {pol.incidents_per_month:g} incident(s)/month, "
            f"budget of the {pol.slo_availability:g} availability SLO"
        )


def _print_criteria(the_plan: Any, criteria: list[tuple[str | None, str, float | None]]) -> None:
    """The criteria overrides in force, one line per drill and criterion: the plan's
    ``criteria:`` with the ``--criterion`` items applied (the rest keep their defaults)."""
    from chaoslib_infer.drills.criterion import threshold_value
    from chaoslib_infer.gameday import cli_criteria

    lines = [
        f"    {drill}: {name}="
        + ("off (not judged)" if (v := threshold_value(name, value)) is None else f"{v:g}")
        for drill, crits in cli_criteria(the_plan, criteria).items()
        for name, value in crits.items()
    ]
    if not lines:
        click.echo("criteria overrides: none (defaults: docs/definitions.md, 'Drill criteria')")
    else:
        click.echo("criteria overrides in force (drill: criterion=threshold):")
        for line in lines:
            click.echo(line)
    _print_own_criteria(the_plan, cli_criteria(the_plan, criteria))


def _print_own_criteria(the_plan: Any, overrides: dict[str, dict[str, Any]]) -> None:
    """Each drill's own criteria in force (its question's rows, overrides applied), one line
    per drill; the common rows (SLOs, budget) are the same for every drill and named once."""
    from chaoslib_infer.verdict.criteria import COMMON, DRILL_CRITERIA, criteria_for

    def show(c: Any) -> str:
        return f"{c.name}{c.op}{c.threshold:g}" if c.threshold is not None else f"{c.name} off"

    click.echo("criteria in force (each drill's own; docs/definitions.md, 'Drill criteria'):")
    for spec in the_plan.drills:
        own = {c.name for c in DRILL_CRITERIA.get(spec.name, [])}
        try:
            crits = criteria_for(spec.name, overrides.get(spec.name) or {})
        except ValueError:  # refused before this point; keep the dry run printing
            crits = criteria_for(spec.name)
        mine = [show(c) for c in crits if c.name in own]
        click.echo(f"  {spec.name}: " + (", ".join(mine) if mine else "the common criteria only"))
    click.echo("  every drill also: " + ", ".join(show(c) for c in COMMON))


def run_plan(the_plan: Any, out_dir: Path, opts: PlanRunOptions, label: str = "game day") -> None:
    """Check everything that can be checked without touching anything, then run (or dry-run)
    ``the_plan`` with ``opts`` into ``out_dir``; the last line says ``LABEL VERDICT`` (``game
    day PASSED``, ``drill oom-kill FAILED``).

    Refused with one line and exit 2, before anything starts: a target outside the allowlist
    (a URL, or a Kubernetes target file's context/namespace: no API call is made), a
    malformed --allow/--slo/stop condition, an experiment that does not load (named), an
    unreadable API key file, a key (file or ``$CHAOS_INFER_API_KEY``) under 8 characters; on a
    real run also an ``--out`` folder that holds files (:mod:`.out_folder`; a killed run's
    folder with something to undo excepted), an unreachable target and, on Kubernetes, a
    node-level drill whose node runs pods of other namespaces
    (:func:`chaoslib_infer.k8s_preflight.check_plan`).
    """
    from chaoslib_infer.safety import redact
    from chaoslib_infer.safety.allowlist import allow_patterns, check_target

    target_url, replicas, engine, dry_run, allow = (
        opts.target_url, opts.replicas, opts.engine, opts.dry_run, opts.allow
    )  # fmt: skip
    k8s = None
    key: str | None = None
    try:
        k8s = check_k8s(the_plan, opts.k8s_file, target_url, bool(replicas or engine))
        if k8s is not None:
            target_url = None
        overrides = _parse_slo(opts.slo)
        criteria = _parse_criteria(the_plan, opts.criterion)
        _apply_policy(the_plan, opts.verdict_policy, overrides)
        allow_patterns(allow, the_plan.path)
        if target_url:
            check_target(target_url, allow, the_plan.path)
        if k8s is not None:  # the file's url: allowed by the operator's patterns, not by itself
            check_target(k8s.url, allow, the_plan.path, what=f"{k8s.source}: url")
        try:
            if opts.api_key_file is not None:
                key = redact.read_key_file(opts.api_key_file)
            else:  # a key set directly in the environment is held to the same length rule
                redact.env_key()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    except InferChaosError as exc:
        fail(str(exc))
        return
    # the load generator inherits the key (never on a command line), the redactor reads it there
    # too: set for this run only, as it was before afterwards (also on an exit or an interrupt)
    with api_key_in_env(key):
        code = _validate_and_run(
            the_plan, out_dir, target_url, replicas, engine, overrides, dry_run, allow, k8s, criteria,
            opts.junit_inconclusive, label, opts.prometheus, list(opts.rules), opts,
        )  # fmt: skip
    if code is not None:
        sys.exit(code)


@contextlib.contextmanager
def api_key_in_env(key: str | None) -> Iterator[None]:
    """``$CHAOS_INFER_API_KEY`` (:data:`chaoslib_infer.safety.redact.API_KEY_ENV`) set to ``key``
    inside the block, and afterwards as it was before (unset if it was); None: left alone.

    The key reaches the load generator (a child process that inherits the environment) and the
    experiments' ``type: env`` configuration this way, and the redactor
    (:func:`chaoslib_infer.safety.redact.known_secrets`) scrubs it from every file and line the
    run writes; :func:`~chaoslib_infer.safety.redact.child_env` keeps it from the lab's processes.
    """
    from chaoslib_infer.safety.redact import API_KEY_ENV

    if key is None:
        yield
        return
    before = os.environ.get(API_KEY_ENV)
    os.environ[API_KEY_ENV] = key
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(API_KEY_ENV, None)
        else:
            os.environ[API_KEY_ENV] = before


def _validate_and_run(
    the_plan: Any,
    out_dir: Path,
    target_url: str | None,
    replicas: int | None,
    engine: str | None,
    overrides: dict[str, float],
    dry_run: bool,
    allow: tuple[str, ...],
    k8s: Any,
    criteria: list[tuple[str | None, str, float | None]],
    junit_inconclusive: str = "failure",
    label: str = "game day",
    prometheus: str | None = None,
    rules: list[Path] | None = None,
    opts: PlanRunOptions | None = None,
) -> int | None:
    """The part of :func:`run_plan` that runs with the API key in the environment: the plan's
    experiments validated, then the dry-run print-out (None) or the preflight and the game day
    (its exit code). Exits 2 with one line on an error of the library."""
    from chaoslib_infer.gameday import run_gameday, validate_plan
    from chaoslib_infer.history.store import database_url, resolve_where

    from .out_folder import out_folder_refusal

    history = resolve_where(opts.history if opts else None, getattr(the_plan, "history", None))
    try:
        validate_plan(the_plan)  # after the key: experiments may reference $CHAOS_INFER_API_KEY
        prepare_out_dir(out_dir, create=False)
        if history is not None:  # a malformed store name is refused before anything starts
            database_url(history, create=False)
    except InferChaosError as exc:
        fail(str(exc))
        return None
    reused = out_folder_refusal(out_dir)  # old files would pass for this run's evidence
    if reused and not dry_run:
        fail(reused)
        return None
    if dry_run:
        if reused:
            click.echo(f"{reused} (a real run refuses it)")
        _print_dry_run(the_plan, out_dir, target_url, replicas, engine, overrides, k8s, criteria)
        return None
    try:
        if k8s is not None:  # one cheap API call: unreachable/forbidden refuses before any load
            from chaoslib_infer.platforms.kubernetes.target import preflight

            preflight(k8s)
            from chaoslib_infer.k8s_preflight import check_plan

            check_plan(the_plan, k8s)  # a shared node: refused here, before any load (exit 2)
        elif target_url:  # TCP connect + one GET: an unreachable URL refuses before any load
            from chaoslib_infer.gameday import preflight_url

            preflight_url(target_url)
        prepare_out_dir(out_dir)
        return run_gameday(
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
            junit_inconclusive=junit_inconclusive,
            label=label,
            prometheus_url=prometheus,
            rules=rules,
            history=history,
            fail_on_regression=bool(opts and opts.fail_on_regression),
        )
    except InferChaosError as exc:
        fail(str(exc))
        return None


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
        "--criterion network-jitter:duplicate_generations=2 (repeatable); VALUE is a number of 0 "
        "or more, or 'off' (the row shows 'not judged'); one criterion given twice must have "
        "one value. Names and defaults: docs/definitions.md, 'Drill criteria'.",
    ),
    click.option(
        "--dry-run",
        is_flag=True,
        help="Print the plan (drills, faults, rollbacks, load settings, criteria overrides) and "
        "touch nothing.",
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
    click.option(
        "--junit-inconclusive",
        type=click.Choice(["failure", "skipped"]),
        default="failure",
        show_default=True,
        help="How junit.xml writes an inconclusive drill: a <failure> (a drill that could not "
        "answer its question is no pass; CI gates read <skipped> as green) or <skipped> (for a "
        "pipeline that gates on exit code 3 itself). The exit code is 3 either way.",
    ),
    click.option(
        "--verdict-policy",
        type=click.Choice(["default", "strict"]),
        default=None,
        help="How the fault's losses are judged, for every drill (default: the plan's "
        "verdict_policy, else 'default'): 'default' judges the fault by its error-budget share "
        "(budget_share), its recovery and the drill's own question; 'strict' also holds the "
        "fault window and the whole drill to the availability, error and timeout SLOs (no "
        "request may be lost). docs/definitions.md, 'Verdict policy'.",
    ),
    click.option(
        "--prometheus",
        default=None,
        metavar="URL",
        help="Read each drill's alerts (ALERTS) from this Prometheus instead of the lab's own "
        "(detection: time to detect, silent and false pages; docs/definitions.md, 'Detection'). "
        "Checked before any fault.",
    ),
    click.option(
        "--rules",
        multiple=True,
        type=click.Path(path_type=Path, dir_okay=False),
        metavar="FILE",
        help="Load this Prometheus rule file (your team's alerts) into the lab's Prometheus "
        "beside the alert table and the SLO burn-rate rules (repeatable; checked with promtool "
        "before any fault).",
    ),
    click.option(
        "--history",
        default=None,
        metavar="URL",
        help="The history store the run is appended to and compared with: an SQLite file "
        "path, sqlite:///PATH or postgresql://USER@HOST/DB, or 'off' (default: "
        "$CHAOS_INFER_HISTORY, the plan's history:, else .chaos-infer/history.sqlite). "
        "docs/definitions.md, 'History comparison'.",
    ),
    click.option(
        "--fail-on-regression",
        is_flag=True,
        help="Exit 1 (and add a junit failure) when a drill's key figure regressed against "
        "its last comparable runs; the drills' own verdicts are unchanged.",
    ),
]


def target_options(func: Any) -> Any:
    """Add the options of a plan run (``--target`` ... ``--api-key-file``, in ``--help`` order);
    the command receives them as one keyword argument, ``opts`` (:class:`PlanRunOptions`)."""
    return packed_options(PlanRunOptions, "opts", _TARGET_OPTIONS)(func)
