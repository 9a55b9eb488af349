"""What the history store keeps of a run, read from its ``summary.json``: a :class:`RunRecord`
(plan, target identity, tool versions) with one :class:`DrillRecord` per drill (verdict,
reasons, numeric figures, costs, windows' request counts, settings and their hash).

Settings are what the operator chose for the drill's client and gateway: the drill's load
settings and plan ``vars`` (``summary.json`` drill ``settings``), the gateway and its options
(``ground_truth.gateway``, the lab's ``gateway*`` options). Two drills with the same settings
hash ran under the same settings; a different hash is a settings change (named, never judged a
regression). The service's own make-up (engine, replicas, engine arguments, versions) is not a
setting: a new engine version that restarts slower is exactly the regression to catch.

Pure: no I/O beyond reading the folder in :func:`read_summary`.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from chaoslib_infer.errors import ConfigError

__all__ = [
    "DrillRecord",
    "RunRecord",
    "read_summary",
    "record_from_summary",
    "settings_diff",
    "settings_hash",
    "unix_of",
]

#: the windows' request counts kept per drill (from ``verdict.windows``)
_WINDOW_KEYS = ("requests", "attempts")
#: the error-budget costs kept per drill (also among its figures)
_COST_KEYS = ("budget_cost_s", "budget_share")


def unix_of(iso: str) -> float:
    """Unix seconds of an ISO 8601 time (``+00:00`` or ``Z``; naive read as UTC).

    Raises:
        ValueError: not an ISO 8601 time.
    """
    text = iso.strip().replace("Z", "+00:00")
    t = datetime.fromisoformat(text)
    if t.tzinfo is None:
        from datetime import UTC

        t = t.replace(tzinfo=UTC)
    return t.timestamp()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def settings_hash(settings: dict[str, Any]) -> str:
    """First 16 hex digits of the SHA-256 of ``settings`` as canonical JSON."""
    return hashlib.sha256(_canonical(settings).encode()).hexdigest()[:16]


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def settings_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What changed from ``old`` to ``new`` settings, one ``key: old -> new`` item each
    (dotted keys, ``(unset)`` for a key one side lacks), sorted."""
    a, b = _flat(old), _flat(new)
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, "(unset)"), b.get(key, "(unset)")
        if _canonical(va) != _canonical(vb):
            out.append(f"{key}: {_short(va)} -> {_short(vb)}")
    return out


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else _canonical(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass
class DrillRecord:
    """One drill of a run as the store keeps it.

    Attributes:
        drill: the drill's name in its plan (``oom-kill``; ``certify/NAME`` for a target of a
            certification).
        status: its verdict state (``passed``, ``failed``, ...).
        reasons: the verdict's reasons.
        figures: every finite numeric figure (name -> value; units as in ``summary.json``).
        settings: the client and gateway settings (module docstring); hashed in
            ``settings_hash``.
        costs: ``budget_cost_s``, ``budget_share`` (None: unmeasured).
        windows: request and attempt counts per verdict window (``{window: {requests,
            attempts}}``).
    """

    drill: str
    status: str
    reasons: list[str] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    costs: dict[str, float | None] = field(default_factory=dict)
    windows: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def settings_hash(self) -> str:
        """:func:`settings_hash` of :attr:`settings`."""
        return settings_hash(self.settings)

    def row(self) -> dict[str, Any]:
        """The ``drill_runs`` row (without ids)."""
        return {
            "drill": self.drill,
            "status": self.status,
            "reasons": self.reasons,
            "settings_hash": self.settings_hash,
            "settings": self.settings,
            "costs": self.costs,
            "windows": self.windows,
            "figures": self.figures,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> DrillRecord:
        """The record of a ``drill_runs`` row (as :meth:`row` wrote it)."""
        return cls(
            drill=row["drill"],
            status=row["status"],
            reasons=list(row.get("reasons") or []),
            figures={k: float(v) for k, v in (row.get("figures") or {}).items()},
            settings=dict(row.get("settings") or {}),
            costs=dict(row.get("costs") or {}),
            windows=dict(row.get("windows") or {}),
        )


@dataclass
class RunRecord:
    """One game day, drill run or certification.

    Attributes:
        kind: ``gameday`` (a plan of drills), ``drill`` (``chaos-infer drill run``) or
            ``certify``.
        plan: the plan's name; target_key: the target's identity (:func:`target_key`);
        started_at, ended_at: ISO 8601; verdict: the run's verdict word (lower case);
        engine: the engine (``sim``, ``llama-cpp``, a cluster's pods, ``unknown``);
        product_version: chaos-infer's version; tool: every tool version recorded;
        source: the evidence folder; drills: the drills.
    """

    kind: str
    plan: str
    plan_path: str | None
    target_key: str
    target: dict[str, Any]
    started_at: str
    ended_at: str | None
    verdict: str | None
    complete: bool
    engine: str
    product_version: str | None
    tool: dict[str, Any]
    source: str | None
    drills: list[DrillRecord]

    @property
    def key(self) -> str:
        """The run's identity in the store: kind, plan and start time (a folder imported twice
        is one run)."""
        return hashlib.sha256(f"{self.kind}|{self.plan}|{self.started_at}".encode()).hexdigest()

    def row(self) -> dict[str, Any]:
        """The ``runs`` row (without its id)."""
        return {
            "run_key": self.key,
            "kind": self.kind,
            "plan": self.plan,
            "plan_path": self.plan_path,
            "target_key": self.target_key,
            "target": self.target,
            "started_at": self.started_at,
            "started_unix": unix_of(self.started_at),
            "ended_at": self.ended_at,
            "verdict": self.verdict,
            "complete": self.complete,
            "engine": self.engine,
            "product_version": self.product_version,
            "tool": self.tool,
            "source": self.source,
        }


def target_key(target: dict[str, Any]) -> str:
    """The identity of a ``summary.json`` target block: ``lab:ENGINE:xREPLICAS``,
    ``url:URL`` or ``kubernetes:CONTEXT/NAMESPACE/SELECTOR``."""
    kind = str(target.get("kind") or "unknown")
    if kind == "lab":
        return f"lab:{target.get('engine')}:x{target.get('replicas')}"
    if kind == "kubernetes":
        return (
            f"kubernetes:{target.get('context')}/{target.get('namespace')}/{target.get('selector')}"
        )
    return f"{kind}:{target.get('url', '')}"


def _windows(entry: dict[str, Any]) -> dict[str, dict[str, int]]:
    wins = (entry.get("verdict") or {}).get("windows") or {}
    out: dict[str, dict[str, int]] = {}
    if isinstance(wins, dict):
        for name, w in wins.items():
            if isinstance(w, dict):
                out[str(name)] = {
                    k: int(w[k]) for k in _WINDOW_KEYS if _number(w.get(k)) is not None
                }
    return out


def _gateway_settings(summary: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    gateway = dict((entry.get("ground_truth") or {}).get("gateway") or {})
    lab = summary.get("lab") or {}
    if isinstance(lab, dict):
        gateway.update({k: v for k, v in lab.items() if str(k).startswith("gateway")})
    return gateway


def _drill_record(summary: dict[str, Any], entry: dict[str, Any]) -> DrillRecord:
    figures = {
        str(k): num
        for k, v in (entry.get("figures") or {}).items()
        if (num := _number(v)) is not None
    }
    raw = entry.get("figures") or {}
    settings = {
        "client": entry.get("settings") or {},
        "gateway": _gateway_settings(summary, entry),
    }
    return DrillRecord(
        drill=str(entry.get("name") or "?"),
        status=str(entry.get("status") or "unknown"),
        reasons=[str(r) for r in entry.get("reasons") or []],
        figures=figures,
        settings=settings,
        costs={k: _number(raw.get(k)) for k in _COST_KEYS},
        windows=_windows(entry),
    )


def _certify_records(summary: dict[str, Any]) -> list[DrillRecord]:
    out = []
    for t in summary.get("targets") or []:
        figures: dict[str, float] = {}
        for tier in (t.get("scorecard") or {}).get("tiers") or []:
            for row in tier.get("rows") or []:
                num = _number(row.get("value"))
                if num is not None and row.get("metric"):
                    figures[str(row["metric"])] = num
        verdict = str(t.get("verdict") or "")
        out.append(
            DrillRecord(
                drill=f"certify/{t.get('name')}",
                status="passed" if verdict == "CERTIFIED" else "failed" if verdict else "unknown",
                reasons=[str(r) for r in t.get("reasons") or []],
                figures=figures,
                settings={"client": summary.get("plan") or {}, "target": t.get("target") or {}},
            )
        )
    return out


def record_from_summary(summary: dict[str, Any], source: Path | None = None) -> RunRecord:
    """The :class:`RunRecord` of a game day's, drill run's or certification's ``summary.json``.

    Args:
        summary: the parsed ``summary.json``.
        source: the evidence folder (kept as the run's ``source``).

    Raises:
        ConfigError: not a summary chaos-infer wrote (no plan or no start time).
    """
    where = f"{source}/summary.json" if source else "summary.json"
    tool: dict[str, Any] = summary["tool"] if isinstance(summary.get("tool"), dict) else {}
    started = summary.get("started_at")
    if not isinstance(started, str):
        raise ConfigError(f"{where}: no started_at (not a chaos-infer summary)")
    try:
        unix_of(started)
    except ValueError:
        raise ConfigError(f"{where}: started_at {started!r} is not an ISO 8601 time") from None
    if summary.get("kind") == "certification":
        plan: dict[str, Any] = summary["plan"] if isinstance(summary.get("plan"), dict) else {}
        names = [str(t.get("name")) for t in summary.get("targets") or []]
        return RunRecord(
            kind="certify",
            plan=str(plan.get("name") or "certification"),
            plan_path=str(plan.get("path")) if plan.get("path") else None,
            target_key="certify:" + ",".join(names),
            target={"targets": names},
            started_at=started,
            ended_at=summary.get("ended_at"),
            verdict=None,
            complete=bool(summary.get("complete")),
            engine="providers",
            product_version=tool.get("chaoslib-infer"),
            tool=tool,
            source=str(source) if source else None,
            drills=_certify_records(summary),
        )
    plan_name = summary.get("plan")
    if not isinstance(plan_name, str) or not isinstance(summary.get("drills"), list):
        raise ConfigError(f"{where}: no plan or drills (not a game-day summary)")
    target: dict[str, Any] = summary["target"] if isinstance(summary.get("target"), dict) else {}
    return RunRecord(
        kind="drill" if plan_name.startswith("drill-") else "gameday",
        plan=plan_name,
        plan_path=summary.get("plan_path"),
        target_key=target_key(target),
        target=target,
        started_at=started,
        ended_at=summary.get("ended_at"),
        verdict=summary.get("verdict"),
        complete=bool(summary.get("complete")),
        engine=str(target.get("engine") or "unknown"),
        product_version=tool.get("chaoslib-infer"),
        tool=tool,
        source=str(source) if source else None,
        drills=[_drill_record(summary, d) for d in summary["drills"] if isinstance(d, dict)],
    )


def read_summary(folder: Path) -> RunRecord:
    """The :class:`RunRecord` of an evidence folder's ``summary.json``.

    Raises:
        ConfigError: no readable ``summary.json``, or not one chaos-infer wrote.
    """
    path = folder / "summary.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{folder}: no summary.json (not an evidence folder)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: unreadable: {exc}") from None
    if not isinstance(summary, dict):
        raise ConfigError(f"{path}: not a chaos-infer summary")
    return record_from_summary(summary, folder.resolve())
