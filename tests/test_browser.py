"""The evidence as a reviewer sees it: a real headless Chromium opens ``index.html`` and a drill's
``evidence.html`` and every plot must have decoded (``naturalWidth > 0``).

The run is synthetic (hand-made records, fault log, journal and a lab's ground-truth files:
``lab.json``, ``events.jsonl`` with the recorder's HAProxy ``lb_state`` snapshots, the engine
ledger) but goes through the real evidence functions: :func:`chaoslib_infer.gameday.drill_evidence`
(figures, plots including the replica count over time, Markdown/HTML) with the lab attached by
:meth:`chaoslib_infer.lab.fleet.Lab.attach`, :func:`chaoslib_infer.evidence.render.render_index`
(scorecard), JUnit XML and the SHA-256 manifest.

Needs Debian's ``chromium`` package; skips, saying so, where it is absent.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from chaoslib_infer.evidence.bundle import junit_xml, verify_manifest, write_manifest
from chaoslib_infer.evidence.render import render_index, write_atomic
from chaoslib_infer.gameday import drill_evidence
from chaoslib_infer.lab.fleet import Lab

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium not installed (Debian package 'chromium'): evidence HTML not opened in a browser",
)

T0 = 1_800_000_000.0
FAULT_AT = T0 + 8.0

# Injected into a copy of the page, next to it (same relative links): after the load event it
# writes, for every <img>, whether it decoded, into the DOM that --dump-dom prints.
_CHECK = """<script>
window.addEventListener('load', function () {
  var out = [];
  for (var i = 0; i < document.images.length; i++) {
    var im = document.images[i];
    out.push({alt: im.alt, complete: im.complete, w: im.naturalWidth, h: im.naturalHeight});
  }
  var pre = document.createElement('pre');
  pre.id = 'img-check';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _records() -> list[dict[str, Any]]:
    """20 s at 10 requests/s over r0..r2; r1 fails from the fault for 1.5 s, then r0/r2 only."""
    out = []
    for i in range(200):
        sent = T0 + i * 0.1
        replica = f"r{i % 3}"
        failed = replica == "r1" and FAULT_AT <= sent < FAULT_AT + 1.5
        if replica == "r1" and sent >= FAULT_AT + 1.5:
            replica = "r0"
        e2e = 0.3 + 0.05 * (i % 7)
        out.append(
            {
                "request_id": f"00000000-0000-4000-8000-{i:012d}",
                "attempt": 1,
                "final": True,
                "intended_at": sent,
                "sent_at": sent,
                "status": None if failed else 200,
                "ok": not failed,
                "error_class": "reset" if failed else None,
                "error": "connection reset" if failed else None,
                "first_byte_at": None if failed else sent + 0.05,
                "first_token_at": None if failed else sent + 0.1,
                "chunk_times": [] if failed else [sent + 0.1, sent + e2e],
                "end_at": sent + (0.02 if failed else e2e),
                "output_tokens": 0 if failed else 24,
                "tokens_source": "usage",
                "replica": None if failed else replica,
                "text_len": 0 if failed else 40,
            }
        )
    return out


def _lab_dir(run: Path) -> Path:
    """A stopped lab's ground truth: r0..r2 ready and UP; r1 OOM-killed at the fault, DOWN in
    HAProxy, restarted, ready and UP again; its first generation after the restart."""
    lab_dir = run / "lab"
    lab_dir.mkdir(parents=True)
    reps = [
        {"name": f"r{i}", "port": 40000 + i, "cgroup": str(lab_dir / f"r{i}")} for i in range(3)
    ]
    (lab_dir / "lab.json").write_text(json.dumps({"replicas": reps, "pids": {}}))
    up = {"r0": "UP", "r1": "UP", "r2": "UP"}
    events = [
        *({"t": T0 - 5.0, "event": "start", "replica": f"r{i}", "pid": 100 + i} for i in range(3)),
        *({"t": T0 - 4.0, "event": "ready", "replica": f"r{i}"} for i in range(3)),
        {"t": T0 - 3.9, "event": "lb_state", "replica": None, "servers": up},
        {"t": FAULT_AT - 0.6, "event": "fault", "kind": "oom-kill", "replica": "r1",
         "phase": "injected"},
        {"t": FAULT_AT, "event": "exit", "replica": "r1", "pid": 101, "cause": "oom"},
        {"t": FAULT_AT + 0.02, "event": "start", "replica": "r1", "pid": 201},
        {"t": FAULT_AT + 0.1, "event": "fault", "kind": "oom-kill", "replica": "r1",
         "phase": "cleared"},
        {"t": FAULT_AT + 0.15, "event": "lb_state", "replica": None, "servers": {**up, "r1": "DOWN"}},
        {"t": FAULT_AT + 1.2, "event": "ready", "replica": "r1"},
        {"t": FAULT_AT + 1.45, "event": "lb_state", "replica": None, "servers": up},
    ]  # fmt: skip
    (lab_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    gen = {"t": FAULT_AT + 1.5, "event": "generation", "replica": "r1", "request_id": "x"}
    (lab_dir / "ledger.jsonl").write_text(json.dumps(gen) + "\n")
    return lab_dir


def _journal() -> dict[str, Any]:
    state = {"steady_state_met": True, "probes": []}
    return {
        "status": "completed",
        "deviated": False,
        "experiment": {"title": "synthetic drill"},
        "steady_states": {"before": state, "after": state, "during": []},
        "run": [],
        "rollbacks": [],
    }


def _synthetic_run(run: Path) -> dict[str, Any]:
    drill_dir = run / "oom-kill"
    drill_dir.mkdir(parents=True)
    with (drill_dir / "records.jsonl").open("w", encoding="utf-8") as fh:
        for r in _records():
            fh.write(json.dumps(r) + "\n")
    (drill_dir / "faults.jsonl").write_text(
        json.dumps({"kind": "oom-kill", "fault_at": FAULT_AT, "replica": "r1"}) + "\n"
    )
    journal = _journal()
    (drill_dir / "journal.json").write_text(json.dumps(journal))
    target = {"kind": "lab", "engine": "sim", "replicas": 3}
    entry = drill_evidence(
        "oom-kill",
        "experiments/oom-kill.yaml",
        "synthetic drill",
        drill_dir,
        journal,
        Lab.attach(_lab_dir(run)),
        target,
        T0 - 2.0,
        T0 + 22.0,
    )
    summary = {
        "plan": "synthetic",
        "target": target,
        "started_at": "2027-01-15T08:00:00+00:00",
        "ended_at": "2027-01-15T08:00:30+00:00",
        "complete": True,
        "drills": [entry],
        "pricing": {"price_per_1k_tokens": 0.002},
    }
    write_atomic(run / "summary.json", json.dumps(summary, indent=2))
    render_index(run, summary, "PASSED")
    write_atomic(run / "junit.xml", junit_xml(summary))
    write_manifest(run)
    return summary


def _images_in_browser(page: Path, tmp_path: Path) -> list[dict[str, Any]]:
    """Open a copy of ``page`` (beside it) with the check script in headless Chromium."""
    assert CHROMIUM is not None
    probe = page.with_name(f".browser-check-{page.name}")
    html = page.read_text(encoding="utf-8")
    probe.write_text(html.replace("</body>", _CHECK + "</body>"), encoding="utf-8")
    try:
        proc = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--no-first-run",
                "--no-default-browser-check",
                f"--user-data-dir={tmp_path / 'chromium-profile'}",
                "--virtual-time-budget=5000",
                "--dump-dom",
                probe.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=90,
        )
    finally:
        probe.unlink(missing_ok=True)
    match = re.search(r'<pre id="img-check">(.*?)</pre>', proc.stdout, re.S)
    assert match, (
        f"chromium rc={proc.returncode}: no check output; stderr tail: {proc.stderr[-800:]}"
    )
    return list(json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&")))


def test_index_and_drill_evidence_render_every_plot(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _synthetic_run(run)
    assert verify_manifest(run) == []

    summary = json.loads((run / "summary.json").read_text())
    gt = summary["drills"][0]["ground_truth"]
    assert gt["replica_died_at"] == FAULT_AT and gt["replica_serving_again_at"] == FAULT_AT + 1.5

    drill_imgs = _images_in_browser(run / "oom-kill" / "evidence.html", tmp_path)
    alts = [i["alt"] for i in drill_imgs]
    # timeline, latency CDF, per-replica share, replica count over time
    assert len(drill_imgs) == 4, alts
    assert alts[0].startswith("Timeline") and alts[1].startswith("Latency CDF")
    assert alts[2].startswith("Per-replica share")
    assert alts[3].startswith("Replica count over time"), alts
    for img in drill_imgs:
        assert img["complete"] and img["w"] > 0 and img["h"] > 0, img
    # the replica-count image the browser decoded is the PNG the bundle holds, at its full size
    with Image.open(run / "oom-kill" / "replica_count.png") as png:
        assert (drill_imgs[3]["w"], drill_imgs[3]["h"]) == png.size
    assert "lb_state" not in alts[3]  # the lab sampled HAProxy: no "not recorded" caveat

    index_imgs = _images_in_browser(run / "index.html", tmp_path)
    assert [i["alt"] for i in index_imgs] == ["oom-kill timeline"]
    for img in index_imgs:
        assert img["complete"] and img["w"] > 0 and img["h"] > 0, img
    index = (run / "index.html").read_text(encoding="utf-8")
    assert "Tier 1: Stability" in index and "Tier 3: Model quality" in index
    # the browser copies were removed: the manifest still verifies
    assert verify_manifest(run) == []


def test_a_broken_plot_is_caught(tmp_path: Path) -> None:
    """Negative control: a corrupt inline PNG reports naturalWidth 0 in the same check."""
    page = tmp_path / "broken.html"
    page.write_text(
        '<!doctype html><html><body><img alt="ok" src="data:image/png;base64,'
        'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==">'
        '<img alt="broken" src="data:image/png;base64,iVBORw0KGgoAAAAbroken"></body></html>',
        encoding="utf-8",
    )
    imgs = {i["alt"]: i for i in _images_in_browser(page, tmp_path)}
    assert imgs["ok"]["w"] == 1 and imgs["ok"]["h"] == 1
    assert imgs["broken"]["w"] == 0
