"""Keep each drill's runbook carrying its latest proof: fill its Evidence section from a run.

``runbooks/<drill>.md`` has an ``## Evidence`` section holding the markers::

    <!-- evidence:start -->
    ...generated, replaced on every fill...
    <!-- evidence:end -->

:func:`fill_runbooks` reads a game day's ``summary.json`` and, for every drill it ran, rewrites the
text between the markers of the matching runbook (by drill name, else by the experiment file's
name, so ``traffic-spike-2`` running ``experiments/traffic-spike.yaml`` lands in
``traffic-spike.md``): the run, the verdict, the hypothesis before/after, the drill's figures and
the lab's ground truth, links to the evidence, and the SHA-256 of the evidence files from the run's
``SHA256SUMS``. Everything outside the markers is left byte for byte. A runbook without markers gets
them at the end of its Evidence section (which is added when missing). The text depends only on
the run, so filling twice from the same run changes nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from pathlib import Path
from typing import Any

from chaoslib_infer.evidence.detection_view import detection_summary
from chaoslib_infer.evidence.render import fmt, write_atomic

__all__ = ["END", "START", "evidence_block", "fill_runbook_text", "fill_runbooks", "runbook_path"]

START = "<!-- evidence:start -->"
END = "<!-- evidence:end -->"

_MAIN_FIGURES = (
    "requests",
    "availability",
    "error_rate",
    "timeout_rate",
    "p50_e2e_s",
    "p99_e2e_s",
    "budget_cost_s",
    "budget_share",
    "interruption_s",
    "failed_requests",
    "recovery_s",
    "restart_s",
    "duplicates",
)
_PROOF_FILES = ("evidence.html", "evidence.md", "journal.json", "records.jsonl", "faults.jsonl")


def _cell(value: Any, key: str = "") -> str:
    if key.endswith("_at") and isinstance(value, int | float) and not isinstance(value, bool):
        # unix seconds (contracts: every time in files): shown as UTC with milliseconds
        when = dt.datetime.fromtimestamp(float(value), dt.UTC)
        return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return fmt(value).replace("|", "\\|").replace("\n", " ")


def _manifest(run_dir: Path) -> dict[str, str]:
    path = run_dir / "SHA256SUMS"
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        digest, sep, rel = line.partition("  ")
        if sep:
            out[rel] = digest
    return out


def _link(run_dir: Path, rel: str, runbook_dir: Path) -> str:
    target = (run_dir / rel).resolve()
    try:
        return os.path.relpath(target, runbook_dir.resolve())
    except ValueError:  # another drive (Windows)
        return str(target)


def evidence_block(
    summary: dict[str, Any], drills: list[dict[str, Any]], run_dir: Path, runbook_dir: Path
) -> str:
    """The Markdown between the markers for ``drills`` (the runs of one runbook's drill).

    Args:
        summary: the run's ``summary.json``.
        drills: the ``summary["drills"]`` entries for this runbook (in run order).
        run_dir: the game-day folder (links and ``SHA256SUMS``).
        runbook_dir: the runbooks folder (links are relative to it where possible).

    Returns:
        Markdown, starting and ending with a newline.
    """
    sums = _manifest(run_dir)
    target = summary.get("target") or {}
    lines = [
        "",
        f"Latest run: plan `{summary.get('plan', '')}`, {summary.get('started_at', '')} → "
        f"{summary.get('ended_at', '')}; target {target.get('kind', '')} "
        f"({target.get('engine', '')}, {target.get('replicas', '')} replicas)"
        + ("" if summary.get("complete", True) else "; **run incomplete**")
        + ".",
        "",
    ]
    for d in drills:
        name = str(d.get("name") or "")
        fig = d.get("figures") or {}
        hyp = d.get("hypothesis") or {}
        lines += [
            f"### {name}: {str(d.get('status', '')).upper()}",
            "",
            *[f"- **Reason:** {r}" for r in d.get("reasons") or []],
            f"- Hypothesis before the fault: {_held(hyp.get('before'))}; after: "
            f"{_held(hyp.get('after'))}.",
            f"- Ran {d.get('started_at', '')} → {d.get('ended_at', '')}.",
        ]
        pol = d.get("verdict_policy")
        if isinstance(pol, dict) and pol.get("name"):
            lines.append(
                f"- Verdict policy: {pol['name']} ({pol.get('incidents_per_month')} "
                f"incident(s)/month, budget of the {pol.get('slo_availability')} SLO)."
            )
        if isinstance(d.get("detection"), dict):  # would anyone have been paged (issue 31)
            lines.append(f"- Detection: {detection_summary(d['detection'])}.")
        if d.get("stop_condition"):
            stop = d["stop_condition"]
            lines.append(f"- Stopped by stop condition {stop.get('guard')}: {stop.get('reason')}.")
        lines += _history_lines(summary, name)
        lines.append(
            f"- Evidence: [{name}/evidence.html]({_link(run_dir, f'{name}/evidence.html', runbook_dir)})"
            f" · [{name}/evidence.md]({_link(run_dir, f'{name}/evidence.md', runbook_dir)})"
        )
        lines += ["", "| figure | value |", "|---|---|"]
        shown = [k for k in _MAIN_FIGURES if k in fig]
        shown += sorted(
            k
            for k, v in fig.items()
            if k not in _MAIN_FIGURES and isinstance(v, int | float | str | bool | type(None))
        )
        lines += [f"| {k} | {_cell(fig[k], k)} |" for k in shown]
        ground = d.get("ground_truth") or {}
        simple = {
            k: v for k, v in ground.items() if isinstance(v, int | float | str | bool | type(None))
        }
        if simple:
            lines += ["", "| ground truth (lab) | value |", "|---|---|"]
            lines += [f"| {k} | {_cell(v, k)} |" for k, v in sorted(simple.items())]
        proofs = [(f, sums[f"{name}/{f}"]) for f in _PROOF_FILES if f"{name}/{f}" in sums]
        if proofs:
            lines += ["", "SHA-256 (from the run's `SHA256SUMS`):", ""]
            lines += [f"- `{name}/{f}`: `{digest}`" for f, digest in proofs]
        lines.append("")
    return "\n".join(lines) + "\n"


def _history_lines(summary: dict[str, Any], name: str) -> list[str]:
    """The drill's comparison with its history (``summary["history"]``, issue 32): one line
    with the reading, the store's run number and the comparison's reasons; none when the run
    was not recorded."""
    hist = summary.get("history") or {}
    comp = (hist.get("drills") or {}).get(name)
    if not isinstance(comp, dict):
        return []
    runs = comp.get("runs") or []
    against = f" against runs {', '.join(f'#{r}' for r in runs)}" if runs else ""
    line = (
        f"- History: run #{hist.get('run_id')} of `{hist.get('store')}`{against}: "
        f"**{comp.get('reading')}**"
    )
    reasons = [str(r) for r in comp.get("reasons") or []]
    return [line + (f" ({'; '.join(reasons)})" if reasons else "") + "."]


def _held(value: Any) -> str:
    return "not evaluated" if value is None else ("held" if value else "**did not hold**")


def fill_runbook_text(text: str, block: str) -> str:
    """Put ``block`` between the markers of ``text`` (adding markers/section when missing).

    Raises:
        ValueError: the markers are out of order or appear more than once.
    """
    n_start, n_end = text.count(START), text.count(END)
    if n_start or n_end:
        if n_start != 1 or n_end != 1 or text.index(START) > text.index(END):
            raise ValueError("evidence markers must appear once each, start before end")
        head, rest = text.split(START, 1)
        _, tail = rest.split(END, 1)
        return f"{head}{START}{block}{END}{tail}"
    match = re.search(r"^## Evidence[ \t]*$", text, re.M)
    if match is None:
        sep = "" if text.endswith("\n") else "\n"
        return f"{text}{sep}\n## Evidence\n{START}{block}{END}\n"
    nxt = re.search(r"^## ", text[match.end() :], re.M)
    cut = match.end() + nxt.start() if nxt else len(text)
    section = text[:cut].rstrip("\n")
    rest = text[cut:]
    return f"{section}\n\n{START}{block}{END}\n" + (f"\n{rest}" if rest else "")


def runbook_path(runbooks_dir: Path, name: str) -> Path:
    """The runbook of drill ``name`` in ``runbooks_dir``: its registry row's
    (:data:`chaoslib_infer.drills.registry.DRILLS`), else ``<name>.md`` (a drill of the
    operator's own, named by its experiment)."""
    from chaoslib_infer.drills.registry import DRILLS

    drill = DRILLS.get(name)
    if drill is not None:
        return drill.path_in(runbooks_dir, "runbook")
    return runbooks_dir / f"{name}.md"


def fill_runbooks(run_dir: Path, runbooks_dir: Path) -> dict[str, Path]:
    """Fill the Evidence section of every runbook whose drill ran in ``run_dir``.

    Args:
        run_dir: a game-day folder (``summary.json``, ``SHA256SUMS``, per-drill folders).
        runbooks_dir: the folder of ``<drill>.md`` runbooks.

    Returns:
        ``{runbook name: path}`` for each runbook written (drills without a runbook are skipped).

    Raises:
        FileNotFoundError: no ``summary.json`` in ``run_dir``.
        ValueError: ``summary.json`` is not a game-day summary, or a runbook's markers are broken.
    """
    run_dir = Path(run_dir)
    runbooks_dir = Path(runbooks_dir)
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    if not isinstance(summary, dict) or not isinstance(summary.get("drills", []), list):
        raise ValueError(f"{run_dir}/summary.json: not a game-day summary")
    groups: dict[str, list[dict[str, Any]]] = {}
    for d in summary.get("drills") or []:
        if not isinstance(d, dict):
            continue
        name = str(d.get("name") or "")
        stem = Path(str(d.get("experiment") or "")).stem
        for candidate in (name, stem):
            if (
                candidate
                and "/" not in candidate
                and runbook_path(runbooks_dir, candidate).is_file()
            ):
                groups.setdefault(candidate, []).append(d)
                break
    written: dict[str, Path] = {}
    for runbook, drills in groups.items():
        path = runbook_path(runbooks_dir, runbook)
        text = path.read_text(encoding="utf-8")
        new = fill_runbook_text(text, evidence_block(summary, drills, run_dir, runbooks_dir))
        if new != text:
            write_atomic(path, new)
        written[runbook] = path
    return written
