"""Game-day plans: which drills to run, in which order, against which lab.

A plan is YAML::

    name: default-gameday
    lab: {replicas: 3, engine: sim, memory_limit_mb: 512}
    drills:
      - name: oom-kill
        experiment: ../experiments/oom-kill.yaml   # relative to the plan file
        vars: {window_s: 8}                        # optional configuration overrides
        criteria: {restart_s: 20}                  # optional threshold overrides ("off": not judged)
    criteria: {availability: 0.9995}               # optional, for every drill that has it
    verdict_policy: default                        # or strict (a drill may set its own)
    incidents_per_month: 1                         # how often each fault is expected (per drill too)
    vars: {load_retry_attempts: 3}                 # optional, for every drill (its own win)

Load settings (``load_<name>``, :data:`chaoslib_infer.load.options.LOAD_SETTINGS`) in ``vars:``
are checked here: a bad value, or a ``load_*`` key that is neither a load setting nor declared by
the drill's experiment (a typo), is refused naming the field.

A plan for a Kubernetes cluster says ``platform: kubernetes`` instead of having a ``lab:``; it may
name its target file (``target: k8s-target.yaml``, relative to the plan), which ``--target FILE``
overrides (see :mod:`chaoslib_infer.platforms.kubernetes.target`).

Malformed plans raise :class:`chaoslib_infer.errors.ConfigError` naming the file and the field.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from chaoslib_infer.errors import ConfigError

ENGINES = ("sim", "llama-cpp")
PLATFORMS = ("lab", "kubernetes")
#: the top-level keys of a plan; ``allow`` is read by ``safety.allowlist.plan_allow`` and
#: ``stop_conditions`` by ``safety.guard.plan_stop_conditions``, ``detection`` by
#: ``evidence.detection.plan_detection``
PLAN_KEYS = "name description platform target lab drills allow stop_conditions criteria vars detection history".split()
#: the verdict policy keys, top level or in a drill (``chaoslib_infer.verdict.policy``)
POLICY_KEYS = ("verdict_policy", "incidents_per_month")
PLAN_KEYS += POLICY_KEYS


@dataclass
class DrillSpec:
    """One drill of a plan: a name (also its evidence folder) and its Chaos Toolkit experiment."""

    name: str
    experiment: Path
    vars: dict[str, Any] = field(default_factory=dict)
    #: threshold overrides of this drill's criteria (the plan's ``criteria:`` merged under them)
    criteria: dict[str, Any] = field(default_factory=dict)
    #: ``strict`` or ``default`` (None: the default policy; ``--verdict-policy`` sets it for all)
    verdict_policy: str | None = None
    #: how often the plan expects this fault per month (None: the default, 1)
    incidents_per_month: float | None = None

    @property
    def kind(self) -> str:
        """Which of the seven drills this is: its name when it is one, else the experiment's
        file stem (``experiments/k8s/oom-kill.yaml`` -> ``oom-kill``)."""
        return drill_kind(self.name, self.experiment)


def drill_kind(name: str, experiment: Path | str | None = None) -> str:
    """The drill (criteria table key) a plan entry runs: ``name`` when it is one of the seven,
    else the experiment file's stem, else ``name`` (the seven:
    :data:`chaoslib_infer.drills.registry.DRILLS`)."""
    from chaoslib_infer.drills.registry import DRILLS

    if name in DRILLS:
        return name
    stem = Path(str(experiment)).stem if experiment else ""
    return stem if stem in DRILLS else name


@dataclass
class LabSpec:
    """How to bring up the local lab for a plan."""

    replicas: int = 3
    engine: str = "sim"
    memory_limit_mb: int = 512
    #: further keyword arguments of ``Lab.up`` (e.g. ``nodes``, ``standby``), checked by the lab
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    """A parsed, validated game-day plan."""

    name: str
    path: Path
    lab: LabSpec
    drills: list[DrillSpec]
    #: ``"lab"`` (the local lab, default) or ``"kubernetes"`` (a cluster named by a target file)
    platform: str = "lab"
    #: the plan's own Kubernetes target file (``target:``), or None
    target: Path | None = None
    #: the history store the plan's runs are appended to (``history:``: an SQLite path or a
    #: database URL, or ``off``; ``--history`` and ``$CHAOS_INFER_HISTORY`` come first), or None
    history: str | None = None


def _check_criteria(
    path: Path,
    where: str,
    spec: DrillSpec,
    plan_criteria: dict[str, Any],
    own: dict[str, Any],
) -> None:
    """Validate and narrow ``spec.criteria``: a plan-wide key must be a criterion of some drill
    (it applies to the drills that have it); a drill's own key must be one of that drill's."""
    from chaoslib_infer.drills.registry import DRILLS
    from chaoslib_infer.verdict import criteria_for

    mine = {c.name for c in criteria_for(spec.kind)}
    anywhere = {c.name for k in DRILLS for c in criteria_for(k)}
    for key in plan_criteria:
        if key not in anywhere:
            raise _fail(path, f"criteria.{key}", "names no criterion of any drill")
    spec.criteria = {k: v for k, v in spec.criteria.items() if k in mine or k in own}
    try:
        criteria_for(spec.kind, spec.criteria)
    except ValueError as exc:
        raise _fail(path, f"{where}.criteria", str(exc)) from None


def _criteria_nodes(root: yaml.Node | None) -> list[tuple[str, yaml.Node]]:
    """The plan's ``criteria:`` mapping nodes, each with where it is (``criteria``,
    ``drills[N].criteria``)."""
    found: list[tuple[str, yaml.Node]] = []
    if not isinstance(root, yaml.MappingNode):
        return found
    for key, value in root.value:
        if key.value == "criteria":
            found.append(("criteria", value))
        if key.value == "drills" and isinstance(value, yaml.SequenceNode):
            for i, item in enumerate(value.value):
                if isinstance(item, yaml.MappingNode):
                    found += [
                        (f"drills[{i}].criteria", v) for k, v in item.value if k.value == "criteria"
                    ]
    return found


def _check_criteria_nodes(path: Path, text: str) -> None:
    """What the loaded YAML no longer shows in a ``criteria:`` mapping: an empty value
    (``restart_s:``, which YAML reads as null, "not judged" without saying so; write ``'off'``,
    or ``null``), a bare ``off`` (YAML 1.1 reads it as false: a threshold of 0), and a criterion
    given twice with different values (YAML keeps the last one silently). Every value given is
    checked (:func:`~chaoslib_infer.drills.criterion.threshold_value`), the one YAML dropped too.

    Raises:
        ConfigError: naming the field, the criterion and the value(s).
    """
    from chaoslib_infer.drills.criterion import override_conflict, threshold_value

    constructor = yaml.constructor.SafeConstructor()
    for where, node in _criteria_nodes(yaml.compose(text, Loader=yaml.SafeLoader)):
        if not isinstance(node, yaml.MappingNode):
            continue  # not a mapping: refused by load_plan with its own message
        seen: dict[tuple[str | None, str], tuple[float | None, str]] = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or not isinstance(value, yaml.ScalarNode):
                continue
            name = str(key.value)
            if value.tag == "tag:yaml.org,2002:null" and value.value == "":
                raise _fail(
                    path, f"{where}.{name}", "empty value; give a number, or 'off' (not judged)"
                )
            if value.tag == "tag:yaml.org,2002:bool" and value.value.lower() == "off":
                raise _fail(
                    path,
                    f"{where}.{name}",
                    "a bare off is YAML for false (a threshold of 0); write 'off', quoted",
                )
            try:
                threshold = threshold_value(name, constructor.construct_object(value))
            except ValueError as exc:
                raise _fail(path, where, str(exc)) from None
            clash = override_conflict(seen, None, name, threshold, str(value.value))
            if clash:
                raise _fail(path, where, clash)


def _policy_fields(
    path: Path, where: str, spec: DrillSpec, raw: dict[str, Any], item: dict[str, Any]
) -> None:
    """Set ``spec``'s verdict policy and incidents per month: the drill's own keys, else the
    plan's top-level ones (:data:`POLICY_KEYS`).

    Raises:
        ConfigError: an unknown policy or a value that is not a number of 0 or more, naming the
            field (:func:`chaoslib_infer.verdict.policy.make_policy`).
    """
    from chaoslib_infer.verdict.policy import make_policy

    for key in POLICY_KEYS:
        scope, value = (where, item[key]) if key in item else ("", raw.get(key))
        try:
            pol = make_policy(**{key.replace("verdict_policy", "name"): value})
        except ValueError as exc:
            raise _fail(path, f"{scope}.{key}".lstrip("."), str(exc)) from None
        if value is not None:
            setattr(spec, key, pol.name if key == "verdict_policy" else pol.incidents_per_month)


def _fail(path: Path, where: str, msg: str) -> ConfigError:
    return ConfigError(f"{path}: {where}: {msg}")


def _gateway_fields(path: Path, options: dict[str, Any]) -> None:
    """Check ``lab.gateway`` / ``lab.gateway_config`` and resolve the config against the plan.

    Raises:
        ConfigError: an unknown gateway, a config that is not a string, or one that is missing.
    """
    from chaoslib_infer.lab.gateways import GATEWAYS

    gateway = options.get("gateway", "haproxy")
    if gateway not in GATEWAYS:
        raise _fail(path, "lab.gateway", f"expected one of {', '.join(GATEWAYS)}, got {gateway!r}")
    cfg = options.get("gateway_config")
    if cfg is None:
        return
    if not isinstance(cfg, str) or not cfg:
        raise _fail(path, "lab.gateway_config", f"expected a file path, got {cfg!r}")
    resolved = (Path(path).parent / cfg).resolve()
    if not resolved.is_file():
        raise _fail(path, "lab.gateway_config", f"no such file: {resolved}")
    options["gateway_config"] = str(resolved)


def _check_load_vars(path: Path, where: str, given: dict[str, Any], experiment: Path) -> None:
    """Check the load settings among ``given`` (a plan's or a drill's ``vars:``).

    Raises:
        ConfigError: a bad value of a load setting, or a ``load_*`` key that is no load setting
            and that the experiment's ``configuration:`` does not declare (the closest setting
            suggested).
    """
    from chaoslib_infer.load.options import VAR_PREFIX, parse_var

    keys = [k for k in given if isinstance(k, str) and k.startswith(VAR_PREFIX)]
    if not keys:
        return
    try:
        declared = (yaml.safe_load(experiment.read_text(encoding="utf-8")) or {}).get(
            "configuration"
        ) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):
        declared = {}  # validate_plan names the unreadable experiment
    for key in keys:
        try:
            parse_var(key, given[key])
        except ValueError as exc:
            if str(exc).startswith(f"{key}: no such load setting") and key in declared:
                continue  # the experiment's own key (e.g. load_max_duration_s of a tool)
            raise _fail(path, f"{where}.{key}", str(exc).partition(": ")[2]) from None


def load_plan(path: Path) -> Plan:
    """Read and validate a plan file.

    Args:
        path: the plan YAML.

    Returns:
        The :class:`Plan`, experiment paths resolved against the plan's folder.

    Raises:
        ConfigError: unreadable file, invalid YAML, a missing/mistyped field, an unknown engine, a
            duplicate drill name, or an experiment file that does not exist.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        raw = yaml.safe_load(text)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read plan: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "YAML"
        raise ConfigError(f"{path}: {where}: invalid YAML") from exc
    except (ValueError, TypeError, IndexError, AttributeError, RecursionError) as exc:
        # PyYAML's constructors raise these on e.g. "2001-13-45" dates, "!!int x", bad merge keys
        raise ConfigError(f"{path}: YAML: invalid value ({type(exc).__name__})") from exc
    if not isinstance(raw, dict):
        raise _fail(path, "top level", "expected a mapping with 'drills'")
    _check_criteria_nodes(path, text)
    for key in raw:
        if key not in PLAN_KEYS:
            close = difflib.get_close_matches(str(key), PLAN_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _fail(
                path, str(key), f"unknown top-level key{hint}; valid: {', '.join(PLAN_KEYS)}"
            )
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise _fail(path, "name", "expected a non-empty string")
    platform = raw.get("platform", "lab")
    if platform not in PLATFORMS:
        raise _fail(path, "platform", f"expected one of {', '.join(PLATFORMS)}, got {platform!r}")
    target: Path | None = None
    if platform == "kubernetes":
        if raw.get("lab") is not None:
            raise _fail(path, "lab", "a plan with platform: kubernetes has no lab")
        if raw.get("target") is not None:
            if not isinstance(raw["target"], str) or not raw["target"]:
                raise _fail(path, "target", "expected the path of a Kubernetes target file")
            target = (path.parent / raw["target"]).resolve()
    elif raw.get("target") is not None:
        raise _fail(path, "target", "only a plan with platform: kubernetes names a target file")
    lab_raw = raw.get("lab") or {}
    if not isinstance(lab_raw, dict):
        raise _fail(path, "lab", "expected a mapping")
    lab = LabSpec()
    for key, typ in (("replicas", int), ("engine", str), ("memory_limit_mb", int)):
        if key in lab_raw:
            value = lab_raw[key]
            if not isinstance(value, typ) or isinstance(value, bool):
                raise _fail(path, f"lab.{key}", f"expected {typ.__name__}, got {value!r}")
            setattr(lab, key, value)
    from chaoslib_infer.lab.fleet import MAX_REPLICAS, Lab

    lab_params = set(inspect.signature(Lab.up).parameters) - {"cls", "state_dir"}
    for key in sorted(set(lab_raw) - {"replicas", "engine", "memory_limit_mb"}, key=str):
        if not isinstance(key, str) or key not in lab_params:
            known = sorted(lab_params | {"replicas", "engine", "memory_limit_mb"})
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _fail(path, f"lab.{key}", f"unknown field{hint}; known: {', '.join(known)}")
        lab.options[key] = lab_raw[key]
    _gateway_fields(path, lab.options)
    if lab.engine not in ENGINES:
        raise _fail(path, "lab.engine", f"expected one of {', '.join(ENGINES)}, got {lab.engine!r}")
    if not 1 <= lab.replicas <= MAX_REPLICAS:
        raise _fail(path, "lab.replicas", f"expected 1..{MAX_REPLICAS}, got {lab.replicas}")
    drills_raw = raw.get("drills")
    if not isinstance(drills_raw, list) or not drills_raw:
        raise _fail(path, "drills", "expected a non-empty list")
    plan_criteria = raw.get("criteria") or {}
    if not isinstance(plan_criteria, dict):
        raise _fail(path, "criteria", "expected a mapping of criterion: threshold")
    plan_vars = raw.get("vars") or {}
    if not isinstance(plan_vars, dict):
        raise _fail(path, "vars", "expected a mapping of configuration key: value")
    drills: list[DrillSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(drills_raw):
        where = f"drills[{i}]"
        if not isinstance(item, dict):
            raise _fail(path, where, "expected a mapping with name and experiment")
        dname = item.get("name")
        exp = item.get("experiment")
        if not isinstance(dname, str) or not dname or "/" in dname:
            raise _fail(path, f"{where}.name", "expected a non-empty name without '/'")
        if dname in seen:
            raise _fail(path, f"{where}.name", f"duplicate drill name {dname!r}")
        seen.add(dname)
        if not isinstance(exp, str) or not exp:
            raise _fail(path, f"{where}.experiment", "expected a path to an experiment file")
        try:
            exp_path = (path.parent / exp).resolve()
        except (OSError, ValueError) as exc:
            raise _fail(path, f"{where}.experiment", f"invalid path {exp!r}") from exc
        if not exp_path.is_file():
            raise _fail(path, f"{where}.experiment", f"no such file: {exp_path}")
        dvars = item.get("vars") or {}
        if not isinstance(dvars, dict):
            raise _fail(path, f"{where}.vars", "expected a mapping")
        dcrit = item.get("criteria") or {}
        if not isinstance(dcrit, dict):
            raise _fail(path, f"{where}.criteria", "expected a mapping of criterion: threshold")
        _check_load_vars(path, "vars", plan_vars, exp_path)
        _check_load_vars(path, f"{where}.vars", dvars, exp_path)
        spec = DrillSpec(
            name=dname,
            experiment=exp_path,
            vars={**plan_vars, **dvars},
            criteria={**plan_criteria, **dcrit},
        )
        _policy_fields(path, where, spec, raw, item)
        _check_criteria(path, where, spec, plan_criteria, dcrit)
        drills.append(spec)
    history = raw.get("history")
    if history is not None and (not isinstance(history, str) or not history.strip()):
        raise _fail(path, "history", "expected an SQLite file path, a database URL or 'off'")
    return Plan(
        name=name,
        path=path.resolve(),
        lab=lab,
        drills=drills,
        platform=str(platform),
        target=target,
        history=history,
    )
