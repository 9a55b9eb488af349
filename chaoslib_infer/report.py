"""Re-rendering a game day's output folder (``chaos-infer report RUN_DIR``) and bundling the
project's runbooks, filled with a run's evidence, into it.

Split out of :mod:`chaoslib_infer.gameday` (issue 12), which bundles the runbooks at the end of
every game day.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from chaoslib_infer.errors import ConfigError
from chaoslib_infer.evidence.bundle import junit_inconclusive as junit_inconclusive_choice
from chaoslib_infer.evidence.bundle import junit_xml, write_manifest
from chaoslib_infer.evidence.journal import read_journal
from chaoslib_infer.evidence.render import render_index, write_atomic
from chaoslib_infer.gameday_evidence import drill_evidence, experiment_title
from chaoslib_infer.lab.fleet import Lab, LabError
from chaoslib_infer.run_progress import Progress, iso
from chaoslib_infer.safety import redact
from chaoslib_infer.verdict import exit_code as verdict_exit_code
from chaoslib_infer.verdict.policy import stored_policy

__all__ = ["bundle_runbooks", "report_run", "runbooks_dir"]


def runbooks_dir() -> Path:
    """The project's runbooks: ``$CHAOS_INFER_RUNBOOKS`` or the checkout's ``runbooks/``."""
    env = os.environ.get("CHAOS_INFER_RUNBOOKS")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "runbooks"


def bundle_runbooks(out_dir: Path, progress: Progress) -> None:
    """Copy the runbooks of the drills that ran into ``out_dir/runbooks`` and fill their Evidence
    sections from this run, so the bundle carries each runbook with its latest proof.

    (``chaos-infer report RUN_DIR --runbooks runbooks/`` updates the project's own copies.)
    """
    from chaoslib_infer.evidence.runbooks import fill_runbooks

    source = runbooks_dir()
    if not source.is_dir() or not (out_dir / "summary.json").exists():
        return
    target = out_dir / "runbooks"
    target.mkdir(exist_ok=True)
    for md in source.glob("*.md"):
        write_atomic(target / md.name, md.read_text(encoding="utf-8"))
    try:
        fill_runbooks(out_dir, target)
    except (OSError, ValueError) as exc:  # evidence already recorded must not be lost over this
        progress(f"warning: runbooks not filled: {exc}")


def report_run(
    run_dir: Path, progress: Progress = print, junit_inconclusive: str | None = None
) -> int:
    """Re-render the evidence of an existing game-day folder (``chaos-infer report RUN_DIR``).

    Every drill of ``summary.json`` is rendered again from its folder (journal, records, fault log)
    and the lab's ground-truth files (the lab may be down). A drill that was running when the
    runner died (``summary.json`` ``in_progress``) is added with status ``incomplete``; the
    summary keeps ``"complete": false``. Known secrets are scrubbed (the lab folder only when no
    lab runs there), then the index, JUnit file and manifest are written again.

    Args:
        run_dir: the game-day folder.
        progress: where progress lines go.
        junit_inconclusive: how ``junit.xml`` writes an inconclusive drill (``failure`` or
            ``skipped``; None: as the run recorded it in ``summary.json``, else ``failure``);
            a choice given is recorded in the summary.

    Returns:
        0 when rendered.

    Raises:
        ConfigError: no readable ``summary.json`` in ``run_dir``, or an inconclusive choice
            (given or recorded) other than ``failure`` / ``skipped``.
    """
    run_dir = Path(run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{run_dir}: no summary.json (not a game-day output folder)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{run_dir}/summary.json: unreadable: {exc}") from exc
    if not isinstance(summary, dict) or not isinstance(summary.get("drills", []), list):
        raise ConfigError(f"{run_dir}/summary.json: not a game-day summary")
    try:
        grey = junit_inconclusive_choice(summary, junit_inconclusive)
    except ValueError as exc:
        raise ConfigError(f"{run_dir}/summary.json: {exc}") from None
    lab: Lab | None = None
    lab_running = False
    if (run_dir / "lab" / "lab.json").exists():
        with contextlib.suppress(LabError):
            lab = Lab.attach(run_dir / "lab")
            lab_running = lab.supervisord_alive()
    target = summary.get("target") or {}
    secrets = redact.known_secrets()
    rendered: list[dict[str, Any]] = []
    todo: list[tuple[dict[str, Any], str | None]] = [
        (d, None) for d in summary.get("drills") or [] if isinstance(d, dict)
    ]
    running = summary.get("in_progress")
    if isinstance(running, dict) and running.get("drill"):
        todo.append(
            ({"name": running["drill"], "started_at": running.get("started_at")}, "incomplete")
        )
    for old, forced in todo:
        name = str(old.get("name") or "")
        drill_dir = run_dir / name
        if not name or "/" in name or not drill_dir.is_dir():
            rendered.append(old)
            continue
        journal = read_journal(drill_dir) or {}
        if journal.get("status") not in ("completed", "failed", "aborted", "interrupted"):
            forced = "incomplete"
        experiment_path = str(old.get("experiment") or "")
        entry = drill_evidence(
            name,
            experiment_path,
            experiment_title(journal, experiment_path),
            drill_dir,
            journal,
            lab,
            target,
            str(old.get("started_at") or ""),
            str(old.get("ended_at") or iso()),
            status=forced,
            criteria=old.get("criteria_overrides") or None,
            policy=stored_policy(old.get("verdict_policy")),
        )
        if forced:
            entry["complete"] = False
        rendered.append(entry)
        progress(f"report: {name}: {entry['status']}")
    summary["drills"] = rendered
    summary["reported_at"] = iso()
    summary["junit_inconclusive"] = grey
    write_atomic(
        run_dir / "summary.json",
        redact.redact_text(json.dumps(summary, indent=2, default=str), secrets),
    )
    statuses = [d.get("status") for d in rendered]
    if not summary.get("complete"):
        verdict = "INCOMPLETE"
    elif summary.get("stopped_by"):
        verdict = "STOPPED"
    else:
        code = verdict_exit_code([str(s) for s in statuses])
        verdict = {0: "PASSED", 1: "FAILED", 2: "ERROR", 3: "INCONCLUSIVE"}.get(code, "ABORTED")
    render_index(run_dir, summary, verdict)
    write_atomic(run_dir / "junit.xml", junit_xml(summary, grey))
    bundle_runbooks(run_dir, progress)
    redact.scrub_tree(run_dir, secrets, skip=[run_dir / "lab"] if lab_running else [])
    write_manifest(run_dir)
    progress(f"report {verdict}: {run_dir / 'index.html'}")
    return 0
