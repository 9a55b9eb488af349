"""Bundle-level evidence: JUnit XML for CI gates, tool/engine versions, SHA-256 manifest."""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from chaoslib_infer.evidence.hypothesis import hypothesis_lines
from chaoslib_infer.evidence.render import write_atomic
from chaoslib_infer.safety.redact import child_env

__all__ = [
    "JUNIT_INCONCLUSIVE",
    "JUNIT_INCONCLUSIVE_DEFAULT",
    "junit_inconclusive",
    "junit_xml",
    "tool_versions",
    "verify_manifest",
    "write_manifest",
]

MANIFEST = "SHA256SUMS"


#: How ``junit.xml`` writes an inconclusive drill: ``failure`` (the default: a drill that could
#: not answer its question is no pass, and CI gates read ``<skipped>`` as green) or ``skipped``
#: (``--junit-inconclusive=skipped``, for a pipeline that gates on inconclusive by itself).
JUNIT_INCONCLUSIVE = ("failure", "skipped")
JUNIT_INCONCLUSIVE_DEFAULT = "failure"


def junit_inconclusive(summary: dict[str, Any], choice: str | None = None) -> str:
    """How an inconclusive drill is written: ``choice`` when given, else the game day's own
    (``summary["junit_inconclusive"]``, recorded by the run), else ``failure``.

    Raises:
        ValueError: a choice that is not one of :data:`JUNIT_INCONCLUSIVE`.
    """
    value = choice or summary.get("junit_inconclusive") or JUNIT_INCONCLUSIVE_DEFAULT
    if value not in JUNIT_INCONCLUSIVE:
        raise ValueError(
            f"junit inconclusive {value!r}: expected one of {', '.join(JUNIT_INCONCLUSIVE)}"
        )
    return str(value)


def junit_xml(summary: dict[str, Any], inconclusive: str | None = None) -> str:
    """Render a game-day summary as JUnit XML: one testcase per drill, as CI systems read it.

    ``passed`` drills pass; ``failed`` (and the older ``deviated``) drills are ``<failure>``;
    ``inconclusive`` drills are ``<failure type="inconclusive">`` by default (the drill could
    not answer its question: not a pass, and a gate reads ``<skipped>`` as green), or
    ``<skipped>`` with ``inconclusive="skipped"`` (:func:`junit_inconclusive`: the argument,
    else the run's recorded choice); ``error``, ``aborted`` and ``incomplete`` drills are
    ``<error>``. The message is the verdict's first reason (``inconclusive: ...`` for an
    inconclusive drill); the element's text holds every reason, one per line, then the
    steady-state hypothesis in words (its title, whether it held before and after the fault, its
    probes and their tolerances: :func:`~chaoslib_infer.evidence.hypothesis.hypothesis_lines`),
    then the key figures (``unmeasured`` when nobody measured them) and the evidence path. A
    game day that failed before (or between) its drills adds an ``<error>`` case, so it never
    reads as green.

    Raises:
        ValueError: ``inconclusive`` (or the recorded choice) is not one of
            :data:`JUNIT_INCONCLUSIVE`.
    """
    grey = junit_inconclusive(summary, inconclusive)
    drills = list(summary.get("drills") or [])
    if summary.get("error") or not drills:
        drills.append(
            {
                "name": "gameday",
                "status": "error",
                "reasons": [str(summary.get("error") or "no drill ran")],
                "figures": {},
                "evidence": summary.get("error") or "no drill ran",
            }
        )
    failed = ("failed", "deviated")
    errors = ("error", "aborted", "incomplete")
    n_grey = sum(1 for d in drills if d.get("status") == "inconclusive")
    n_failed = sum(1 for d in drills if d.get("status") in failed)
    suite = ET.Element(
        "testsuite",
        name=f"gameday:{summary.get('plan', '')}",
        tests=str(len(drills)),
        failures=str(n_failed + (n_grey if grey == "failure" else 0)),
        errors=str(sum(1 for d in drills if d.get("status") in errors)),
        skipped=str(n_grey if grey == "skipped" else 0),
        timestamp=str(summary.get("started_at") or ""),
    )
    for d in drills:
        case = ET.SubElement(
            suite, "testcase", classname="chaoslib_infer.drill", name=str(d.get("name"))
        )
        figures = d.get("figures") or {}
        reasons = [str(r) for r in d.get("reasons") or []]
        detail = "\n".join(
            [
                *reasons,
                *hypothesis_lines(d),
                f"availability={_figure(figures.get('availability'))} "
                f"p99_e2e_s={_figure(figures.get('p99_e2e_s'))} evidence={d.get('evidence')}",
            ]
        )
        status = str(d.get("status"))
        message = reasons[0] if reasons else f"drill {status}"
        if status in failed:
            ET.SubElement(case, "failure", message=message, type=status).text = detail
        elif status == "inconclusive":
            note = f"inconclusive: {message}"
            if grey == "failure":
                ET.SubElement(case, "failure", message=note, type="inconclusive").text = detail
            else:
                ET.SubElement(case, "skipped", message=note).text = detail
        elif status in errors:
            ET.SubElement(case, "error", message=message, type=status).text = detail
        ET.SubElement(case, "system-out").text = detail
    _regression_cases(suite, summary)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)


def _regression_cases(suite: ET.Element, summary: dict[str, Any]) -> None:
    """With ``--fail-on-regression`` (``summary["history"]["fail_on_regression"]``): one
    ``history:DRILL`` test case per drill the history comparison read ``regressed``, a
    ``<failure type="regression">`` with the comparison's reasons (issue 32); the drills' own
    cases are unchanged."""
    hist = summary.get("history") or {}
    if not hist.get("fail_on_regression"):
        return
    for name in hist.get("regressed") or []:
        reasons = [str(r) for r in ((hist.get("drills") or {}).get(name) or {}).get("reasons", [])]
        case = ET.SubElement(
            suite, "testcase", classname="chaoslib_infer.history", name=f"history:{name}"
        )
        message = reasons[0] if reasons else "regressed against its history"
        ET.SubElement(case, "failure", message=message, type="regression").text = "\n".join(reasons)
        suite.set("tests", str(int(suite.get("tests") or 0) + 1))
        suite.set("failures", str(int(suite.get("failures") or 0) + 1))


def _figure(value: Any) -> str:
    """A figure in ``junit.xml``: ``unmeasured`` when nobody measured it, never ``None``."""
    return "unmeasured" if value is None else str(value)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def tool_versions() -> dict[str, str | None]:
    """Versions of the tools that produced the evidence (Python packages, HAProxy, kernel)."""
    out: dict[str, str | None] = {
        name: _version(name)
        for name in (
            "chaoslib-infer",
            "chaostoolkit",
            "chaostoolkit-lib",
            "aiohttp",
            "supervisor",
            "hdrhistogram",
            "llama_cpp_python",
        )
    }
    out["python"] = platform.python_version()
    out["kernel"] = platform.release()
    try:
        proc = subprocess.run(
            ["haproxy", "-v"], capture_output=True, text=True, timeout=5, env=child_env()
        )
        out["haproxy"] = proc.stdout.splitlines()[0] if proc.stdout else None
    except (OSError, subprocess.SubprocessError):
        out["haproxy"] = None
    return out


def write_manifest(out_dir: Path, exclude: tuple[str, ...] = ("lab",)) -> Path:
    """Write ``SHA256SUMS`` (``sha256sum -c`` format) over every file of the bundle.

    Args:
        out_dir: the bundle folder.
        exclude: top-level folders left out (the lab's own state, logs and sockets).

    Returns:
        The manifest path.
    """
    lines = []
    for path in sorted(p for p in out_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(out_dir)
        if rel.parts[0] in exclude or rel.name == MANIFEST or rel.name.startswith("."):
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        lines.append(f"{digest}  {rel.as_posix()}")
    manifest = out_dir / MANIFEST
    write_atomic(manifest, "\n".join(lines) + "\n")
    return manifest


def verify_manifest(out_dir: Path) -> list[str]:
    """Check ``SHA256SUMS``; return the files that are missing or changed (empty: verified)."""
    bad = []
    for line in (out_dir / MANIFEST).read_text(encoding="utf-8").splitlines():
        digest, _, rel = line.partition("  ")
        path = out_dir / rel
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            bad.append(rel)
    return bad
