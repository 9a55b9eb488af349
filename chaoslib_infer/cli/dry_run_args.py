"""``--dry-run``: an activity's arguments as the run will pass them, ``${...}`` resolved.

Chaos Toolkit's own rules, through its public API: the experiment's configuration is loaded with
:func:`chaoslib.configuration.load_configuration` (an ``env`` key from the environment, else its
default; the plan's ``vars:``, the ``--load-*`` and ``--slo`` options and the run's folders over
the declared keys, as :func:`chaoslib_infer.drill_run.run_drill` hands them to chaoslib), then
:func:`chaoslib.substitute` replaces each ``${key}``. A placeholder stays only where its key is
defined nowhere (or is a secret, never printed); the dry run names it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = ["drill_configuration", "resolve", "unresolved_note"]

_PLACEHOLDER = re.compile(r"\$\{([^}]+)\}")


def drill_configuration(
    experiment: dict[str, Any],
    drill_vars: dict[str, Any],
    slo: dict[str, float],
    run_dir: Path,
    lab_dir: Path | None,
    base_url: str | None,
    k8s_target: str | None = None,
) -> dict[str, Any]:
    """The configuration a drill's activities would see: the experiment's, loaded by chaoslib,
    with what the game day sets over it (its run folder, the lab's folder, the target URL, the
    ``--slo`` overrides as ``slo_<name>``, the drill's ``vars:``).

    Args:
        experiment: the experiment, as loaded. drill_vars: the plan's ``vars:`` with the
            ``--load-*`` options over them. slo: the ``--slo`` overrides.
        run_dir, lab_dir, base_url: the drill's evidence folder, the lab's (None: no lab),
            the ``--target`` URL (None: the lab's).
        k8s_target: the Kubernetes target file (resolved), or None.

    Returns:
        ``{key: value}``; where chaoslib cannot load it (an ``env`` key unset and without a
        default) only the plain values and the game day's keys, the rest left undefined.
    """
    from chaoslib.configuration import load_configuration

    from chaoslib_infer.load.options import LOAD_SETTINGS

    extra: dict[str, Any] = {"infer_run_dir": str(run_dir), "infer_base_url": base_url or ""}
    if lab_dir is not None:
        extra["infer_lab_dir"] = str(lab_dir)
    if k8s_target is not None:
        extra["infer_k8s_target"] = k8s_target
    extra.update({f"slo_{k}": v for k, v in slo.items()})
    extra.update(drill_vars)
    declared = dict(experiment.get("configuration") or {})
    for setting in LOAD_SETTINGS:  # the run declares them too (drill_run._declare_load_vars)
        if setting.var in extra:
            declared.setdefault(setting.var, extra[setting.var])
    try:
        return dict(load_configuration(declared, dict(extra)) or {})
    except Exception:  # chaoslib: an env key without default, unset here
        plain = {k: v for k, v in declared.items() if not isinstance(v, dict)}
        return {**plain, **{k: v for k, v in extra.items() if k in declared}}


def resolve(value: Any, configuration: dict[str, Any]) -> tuple[Any, list[str]]:
    """``value`` with each ``${key}`` substituted from ``configuration`` (Chaos Toolkit's rules:
    a whole-string placeholder takes the value's type), and the keys left unresolved, sorted."""
    from chaoslib import substitute

    out = substitute(value, configuration, {})
    left = sorted(set(_PLACEHOLDER.findall(json.dumps(out, default=str))))
    return out, left


def unresolved_note(keys: list[str], experiment: dict[str, Any]) -> str:
    """`` [unresolved: ${a} (undefined), ${b} (a secret, not shown)]``, or "" when none."""
    if not keys:
        return ""
    scopes = (experiment.get("secrets") or {}).values()
    secrets = {k for scope in scopes if isinstance(scope, dict) for k in scope}
    parts = [f"${{{k}}} ({'a secret, not shown' if k in secrets else 'undefined'})" for k in keys]
    return f" [unresolved: {', '.join(parts)}]"
