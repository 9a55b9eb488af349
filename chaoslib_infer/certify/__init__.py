"""Provider certification: the same plan against several targets, one side-by-side report.

``chaos-infer certify --target A.yaml --target B.yaml [--out DIR] [--quick]`` loads each target
file (:mod:`chaoslib_infer.platforms.endpoint`: profile, URL, model, key source, price; refused
outside the allowlist), probes each for conformance to its provider profile
(:mod:`chaoslib_infer.providers`), runs the plan's phases against each in turn
(:mod:`chaoslib_infer.certify.run`: three-phase load test, soak, client-side faults), scores them
in three priority tiers and ranks them (:mod:`chaoslib_infer.certify.report`), then writes
``summary.json``, ``report.html`` (self-contained, plots inlined), ``report.md``, per target
``<name>/<phase>/records.jsonl`` and ``timeline.png``, and ``SHA256SUMS``; every file is scrubbed
of the targets' keys: live (the keys are registered with the redactor for the run,
:func:`chaoslib_infer.safety.redact.run_secrets`, so records and error texts never hold one),
and once more at the end.

Exit status (:func:`certify_command`): 0 every target certified, 1 a target is not certified,
2 bad input or an unreachable target (one line; evidence already written is kept), 130
interrupted (partial evidence kept, scrubbed). The faults are client-side only and live in this
process, so there is nothing to roll back.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from chaoslib_infer.errors import ConfigError, InferChaosError, TargetUnreachable

from .plan import PHASES, CertPlan, default_plan_path, load_plan

__all__ = [
    "PHASES",
    "CertPlan",
    "certify_command",
    "default_plan_path",
    "load_plan",
    "run_certification",
]

Log = Callable[[str], None]


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _verdict(result: dict[str, Any]) -> tuple[str, list[str]]:
    from .report import cell

    reasons = []
    probe = result.get("probe") or {}
    for row in probe.get("rows", []):
        if row["critical"] and not row["passed"]:
            reasons.append(f"conformance: {row['check']}: {row['observed']}")
    for tier in result["scorecard"]["tiers"][:2]:
        for row in tier["rows"]:
            if row["passed"] is False:
                reasons.append(f"{row['metric']} {cell(row)} (reference {row['reference']})")
    ok = (
        bool(probe.get("usable"))
        and result["scorecard"]["tiers"][0]["verdict"] == "PASS"
        and result["scorecard"]["tiers"][1]["verdict"] != "FAIL"
    )
    return ("CERTIFIED" if ok else "NOT CERTIFIED"), reasons


def _write_summary(out: Path, summary: dict[str, Any]) -> None:
    from chaoslib_infer.evidence.render import write_atomic

    write_atomic(out / "summary.json", json.dumps(summary, indent=1, default=str))


def run_certification(
    targets: Sequence[Any],
    plan: CertPlan,
    out: Path,
    log: Log = lambda _m: None,
) -> dict[str, Any]:
    """Probe, run, score, rank and report every target (module docstring).

    Args:
        targets: ``EndpointTarget`` objects (unique names).
        plan: the plan.
        out: output folder (created).
        log: progress line sink (lines carry no key).

    Returns:
        The summary (as written to ``summary.json``): ``kind, plan, started_at, ended_at,
        wall_s, complete, targets`` (ranked: ``name, rank, verdict, reasons, target, probe,
        phases, scorecard``), ``ranking`` (names), ``model_quality``.

    Raises:
        TargetUnreachable: a target does not connect, or refuses the chat route (401/403/404);
            raised after the probes, before any load (``summary.json`` says which).
        KeyboardInterrupt: interrupted (SIGINT or SIGTERM); the partial summary is written.
        OSError: the output folder is not writable.
    """
    from chaoslib_infer.evidence.bundle import tool_versions, write_manifest
    from chaoslib_infer.evidence.scorecard import MODEL_QUALITY_NOTE
    from chaoslib_infer.load.client import new_loop
    from chaoslib_infer.platforms.endpoint import probe_target
    from chaoslib_infer.safety.redact import known_secrets, run_secrets, scrub_tree

    from .ranking import rank_targets
    from .report import render_report, score_target
    from .run import run_phases

    out.mkdir(parents=True, exist_ok=True)
    secrets = known_secrets([t.key for t in targets if t.key])
    t_start = time.monotonic()
    summary: dict[str, Any] = {
        "kind": "certification",
        "plan": plan.describe(),
        "started_at": _now(),
        "ended_at": None,
        "wall_s": 0.0,
        "complete": False,
        "targets": [],
        "ranking": [],
        "model_quality": MODEL_QUALITY_NOTE,
        "tool": tool_versions(),
    }

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # the targets' keys are scrubbed live (records, error texts) for the run, not only at the end;
    # in memory only: never in os.environ or a file
    keys = contextlib.ExitStack()
    keys.enter_context(run_secrets(t.key for t in targets))
    old = signal.signal(signal.SIGTERM, on_term)
    try:
        probes = {}
        for t in targets:
            log(f"probe {t.name} ({t.profile.name}) at {t.chat_url}")
            pr = probe_target(t, timeout_s=min(float(plan.request["timeout_s"]), 30.0))
            probes[t.name] = pr
            why = pr.get("unreachable") or pr.get("refused")
            if why:
                summary["error"] = f"target {t.name}: {why}"
                raise TargetUnreachable(summary["error"])
        for t in targets:
            tdir = out / t.name
            log(f"certify {t.name}: phases {', '.join(p for p in PHASES if plan.enabled(p))}")
            result: dict[str, Any] = {
                "name": t.name,
                "target": t.describe(),
                "probe": probes[t.name],
            }
            result["phases"] = []
            summary["targets"].append(result)
            with asyncio.Runner(loop_factory=new_loop) as runner:
                runner.run(
                    run_phases(
                        t, plan, tdir, bool(probes[t.name]["include_usage"]), log, result["phases"]
                    )
                )
            result["scorecard"] = score_target(result, tdir, plan)
            result["verdict"], result["reasons"] = _verdict(result)
            summary["wall_s"] = round(time.monotonic() - t_start, 1)
            _write_summary(out, summary)
        ranked = rank_targets(summary["targets"])  # ties where the intervals overlap
        summary["targets"] = ranked
        summary["ranking"] = [r["name"] for r in ranked]
        summary["complete"] = True
        summary["ended_at"] = _now()
        summary["wall_s"] = round(time.monotonic() - t_start, 1)
        _write_summary(out, summary)
        render_report(out, summary)
        return summary
    finally:
        signal.signal(signal.SIGTERM, old)
        if not summary["complete"]:
            summary["ended_at"] = _now()
            summary["wall_s"] = round(time.monotonic() - t_start, 1)
            try:
                _write_summary(out, summary)
            except OSError:
                pass
        scrub_tree(out, secrets)
        try:
            write_manifest(out, exclude=())
        except OSError:
            pass
        keys.close()


def certify_command(
    target_files: Sequence[Path],
    out: Path,
    plan_path: Path | None = None,
    quick: bool = False,
    scale: float = 1.0,
    soak_s: float | None = None,
    allow: Sequence[str] = (),
    dry_run: bool = False,
    echo: Log = print,
    err: Log = print,
    history: str | None = None,
) -> int:
    """What ``chaos-infer certify`` does; returns the exit status (module docstring).

    ``history``: the history store a finished certification is appended to, each target
    compared with its earlier certifications (:mod:`chaoslib_infer.history`; None: not
    recorded; a store that cannot be written is one line, the evidence stands).

    Bad input (a target or plan file, an option) and an unreachable target print one line
    through ``err`` (``chaos-infer: error: ...``) and return 2. Every printed line is scrubbed of
    the targets' keys.
    """
    from chaoslib_infer.platforms.endpoint import load_target
    from chaoslib_infer.safety.redact import known_secrets, redact_text

    from .report import console_table

    secrets: list[str] = []

    def say(msg: str) -> None:
        echo(redact_text(msg, secrets))

    try:
        plan = load_plan(plan_path, quick=quick, scale=scale, soak_s=soak_s)
        if not target_files:
            raise ConfigError("give at least one --target FILE")
        targets = [load_target(p, tuple(allow)) for p in target_files]
        names = [t.name for t in targets]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"two targets are named {dup[0]!r}: give each a unique name: field")
        secrets = known_secrets([t.key for t in targets if t.key])
    except InferChaosError as exc:
        err(f"chaos-infer: error: {exc}")
        return 2
    if dry_run:
        say(f"plan {plan.name} ({plan.path or 'built-in defaults'}){' quick' if quick else ''}")
        for name in PHASES:
            cfg = plan.phases[name]
            state = "" if plan.enabled(name) else " (disabled)"
            say(
                f"  {name}{state}: "
                + ", ".join(f"{k}={v}" for k, v in cfg.items() if k != "enabled")
            )
        for t in targets:
            d = t.describe()
            say(
                f"target {t.name}: {d['profile_title']} at {d['chat_url']} model {t.model}, auth {d['auth']}"
            )
        say("dry run: no request was sent")
        return 0
    try:
        summary = run_certification(targets, plan, out, say)
    except TargetUnreachable as exc:
        err(redact_text(f"chaos-infer: error: {exc}", secrets))
        return 2
    except KeyboardInterrupt:
        err(f"chaos-infer: interrupted; partial evidence in {out}")
        return 130
    except (InferChaosError, ValueError) as exc:
        err(redact_text(f"chaos-infer: error: {exc}", secrets))
        return 2
    say(console_table(summary))
    if history is not None and summary.get("complete"):
        from chaoslib_infer.history import record_summary

        try:
            record_summary(summary, out, history, say)
        except Exception as exc:  # the evidence stands: a store failure is one line
            say(
                f"history: not recorded: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
            )
    say(f"report: {out / 'report.html'}")
    return 0 if all(t["verdict"] == "CERTIFIED" for t in summary["targets"]) else 1
