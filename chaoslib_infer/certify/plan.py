"""The certification plan (``drills/certification.yaml``): phases, their scale, the SLOs.

Every key has a built-in default (:data:`DEFAULTS`, the same values as the shipped plan), so a
plan file only needs what it changes. Unknown keys are refused (one line naming the file and the
key), as are values of the wrong type.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from chaoslib_infer.errors import ConfigError
from chaoslib_infer.measure.slo import Thresholds

__all__ = ["DEFAULTS", "PHASES", "CertPlan", "default_plan_path", "load_plan"]

#: Phase order (the order they run in).
PHASES: tuple[str, ...] = ("single", "ramp", "burst", "soak", "jitter", "timeouts")

#: Built-in defaults; the shipped plan restates them.
DEFAULTS: dict[str, Any] = {
    "name": "certification",
    "description": "",
    "request": {"max_tokens": 32, "prompt_words": 16, "timeout_s": 30.0},
    "slo": {
        "p50_e2e_s": 2.0,
        "p95_over_p50": 3.0,
        "p99_e2e_s": 10.0,
        "timeout_rate": 0.005,
        "error_rate": 0.001,
        "availability": 0.999,
    },
    "recovery": {"window_s": 2.0, "settle_s": 5.0},
    "phases": {
        "single": {"enabled": True, "requests": 100},
        "ramp": {"enabled": True, "concurrency": [8, 32, 64], "step_s": 15.0},
        "burst": {
            "enabled": True,
            "factor": 2.0,
            "base_fraction": 0.5,
            "pre_s": 10.0,
            "burst_s": 15.0,
            "post_s": 20.0,
            "max_concurrency": 1024,
        },
        "soak": {
            "enabled": True,
            "duration_s": 120.0,
            "rate_rps": 8.0,
            "mix": "short:70,mid:25,long:5",
            "max_tokens_scale": 1.0,
            "lag_p99_max_ms": 50.0,
        },
        "jitter": {
            "enabled": True,
            "rate_rps": 8.0,
            "pre_s": 10.0,
            "jitter_s": 20.0,
            "post_s": 15.0,
            "delay_ms": 400.0,
            "jitter_ms": 300.0,
            "distribution": "normal",
            "attempt_timeout_s": 5.0,
            "retry_attempts": 3,
            "backoff_s": 0.2,
        },
        "timeouts": {
            "enabled": True,
            "rate_rps": 8.0,
            "duration_s": 30.0,
            "attempt_timeout_s": 10.0,
            "retry_attempts": 3,
            "backoff_s": 0.2,
        },
    },
}

#: Keys scaled by ``--scale`` (durations and counts).
_SCALED = {"requests", "step_s", "pre_s", "burst_s", "post_s", "duration_s", "jitter_s"}


@dataclass
class CertPlan:
    """A loaded plan (see ``drills/certification.yaml``; times in seconds).

    Attributes:
        name: plan name.
        description: what it does.
        request: ``max_tokens``, ``prompt_words``, ``timeout_s``.
        slo: acceptance thresholds.
        recovery: ``window_s``, ``settle_s`` of the recovery measurement.
        phases: per phase its parameters (``enabled`` among them).
        path: the plan file (None: built-in defaults).
        quick: the ``quick:`` overrides were applied.
        scale: the ``--scale`` factor applied.
    """

    name: str
    description: str
    request: dict[str, Any]
    slo: Thresholds
    recovery: dict[str, float]
    phases: dict[str, dict[str, Any]]
    path: str | None = None
    quick: bool = False
    scale: float = 1.0
    slo_raw: dict[str, Any] = field(default_factory=dict)

    def enabled(self, phase: str) -> bool:
        """Whether ``phase`` runs."""
        return bool(self.phases[phase].get("enabled", True))

    def describe(self) -> dict[str, Any]:
        """JSON-able copy for the evidence."""
        return {
            "name": self.name,
            "path": self.path,
            "quick": self.quick,
            "scale": self.scale,
            "request": self.request,
            "slo": self.slo_raw,
            "recovery": self.recovery,
            "phases": self.phases,
        }


def default_plan_path() -> Path:
    """``$CHAOS_INFER_CERT_PLAN`` or the checkout's ``drills/certification.yaml``."""
    env = os.environ.get("CHAOS_INFER_CERT_PLAN")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "drills" / "certification.yaml"


def _check(value: Any, default: Any, where: str) -> Any:
    """``value`` checked against the type of ``default``."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if isinstance(default, list):
        ok = (
            isinstance(value, list)
            and value
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
        )
        if not ok:
            raise ConfigError(f"{where}: expected a non-empty list of integers >= 1, got {value!r}")
        return list(value)
    if isinstance(default, str):
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if isinstance(default, int):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{where}: expected an integer >= 1, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if value <= 0:
        raise ConfigError(f"{where}: expected a number > 0, got {value!r}")
    return float(value)


def _merge(base: dict[str, Any], over: Any, where: str, nullable: bool = False) -> None:
    if over is None:
        return
    if not isinstance(over, dict):
        raise ConfigError(f"{where}: expected a mapping")
    for key, value in over.items():
        if key not in base:
            known = ", ".join(sorted(base))
            raise ConfigError(f"{where}: unknown key {key!r} (known: {known})")
        if isinstance(base[key], dict):
            _merge(base[key], value, f"{where}.{key}")
        elif value is None and nullable:
            base[key] = None
        else:
            default = base[key] if base[key] is not None else DEFAULTS["slo"].get(key, 1.0)
            base[key] = _check(value, default, f"{where}.{key}")


def load_plan(
    path: str | Path | None = None,
    quick: bool = False,
    scale: float = 1.0,
    soak_s: float | None = None,
) -> CertPlan:
    """Load a certification plan over the built-in defaults.

    Args:
        path: plan file (None: :func:`default_plan_path` when it exists, else the defaults).
        quick: apply the plan's ``quick:`` overrides.
        scale: multiply every duration and count (``requests``, ``*_s`` of the phases) by it.
        soak_s: set the soak's duration (after ``scale``).

    Returns:
        The plan.

    Raises:
        ConfigError: unreadable file, unknown key, wrong type, ``scale``/``soak_s`` not > 0.
    """
    if not (isinstance(scale, int | float) and math.isfinite(scale) and scale > 0):
        raise ConfigError(f"--scale must be a number > 0, got {scale!r}")
    if soak_s is not None and not (math.isfinite(soak_s) and soak_s > 0):
        raise ConfigError(f"--soak-s must be a number > 0, got {soak_s!r}")
    given = path is not None
    p = Path(path) if path is not None else default_plan_path()
    doc: dict[str, Any] = {}
    if given or p.is_file():
        try:
            raw = yaml.safe_load(p.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read plan {p}: {exc.strerror or exc}") from None
        except yaml.YAMLError:
            raise ConfigError(f"{p}: not valid YAML") from None
        if raw is not None and not isinstance(raw, dict):
            raise ConfigError(f"{p}: expected a mapping (name, request, slo, phases, quick)")
        doc = raw or {}
    unknown = sorted(set(doc) - (set(DEFAULTS) | {"quick"}), key=str)
    if unknown:
        raise ConfigError(
            f"{p}: unknown key {unknown[0]!r} (known: {', '.join(sorted(DEFAULTS))}, quick)"
        )
    plan = copy.deepcopy(DEFAULTS)
    for key in ("name", "description"):
        if key in doc:
            plan[key] = str(doc[key] or "")
    for key in ("request", "slo", "recovery", "phases"):
        _merge(plan[key], doc.get(key), f"{p}: {key}", nullable=key == "slo")
    if quick:
        q = doc.get("quick") or {}
        if not isinstance(q, dict):
            raise ConfigError(f"{p}: quick: expected a mapping")
        bad = sorted(set(q) - {"request", "slo", "recovery", "phases"}, key=str)
        if bad:
            raise ConfigError(f"{p}: quick: unknown key {bad[0]!r}")
        for key in ("request", "slo", "recovery", "phases"):
            _merge(plan[key], q.get(key), f"{p}: quick.{key}", nullable=key == "slo")
    for phase in plan["phases"].values():
        for key in list(phase):
            if key in _SCALED:
                phase[key] = phase[key] * scale
                if key == "requests":
                    phase[key] = max(1, int(round(phase[key])))
    if soak_s is not None:
        plan["phases"]["soak"]["duration_s"] = float(soak_s)
    plan["request"]["max_tokens"] = int(plan["request"]["max_tokens"])
    plan["request"]["prompt_words"] = int(plan["request"]["prompt_words"])
    jit = plan["phases"]["jitter"]
    if jit["distribution"] not in ("normal", "uniform"):
        raise ConfigError(f"{p}: phases.jitter.distribution: expected normal or uniform")
    from chaoslib_infer.load.soak import parse_mix

    try:
        parse_mix(plan["phases"]["soak"]["mix"])
    except ValueError as exc:
        raise ConfigError(f"{p}: phases.soak.mix: {exc}") from None
    return CertPlan(
        name=plan["name"],
        description=plan["description"],
        request=plan["request"],
        slo=Thresholds(**plan["slo"]),
        recovery=plan["recovery"],
        phases=plan["phases"],
        path=str(p) if (given or p.is_file()) else None,
        quick=quick,
        scale=float(scale),
        slo_raw=dict(plan["slo"]),
    )
