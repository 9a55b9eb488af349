"""Detection in the session's default game day (the shared run: no lab time of its own).

The lab's Prometheus must read every drill's alerts, and the lab's own rules must agree with the
burn the load client measured: a silent or false page there would be the tool's, not the
service's (issue 31)."""

from __future__ import annotations

import shutil

import pytest
from labutil import GamedayRun

from chaoslib_infer.evidence.scorecard import build_scorecard

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus"),
]


def test_every_drill_reads_its_alerts_and_the_labs_rules_agree_with_the_burn(
    default_gameday: GamedayRun,
) -> None:
    run = default_gameday
    assert "detection: Prometheus at http://127.0.0.1:" in run.proc.stdout
    assert "scrape and evaluation every 1 s" in run.proc.stdout
    for d in run.summary["drills"]:
        det = d.get("detection")
        assert isinstance(det, dict) and not det.get("error"), (d["name"], det)
        assert det["interval_s"] == 1.0
        reasons = d.get("reasons") or []
        assert not [r for r in reasons if r.startswith(("detection: silent", "detection: false"))]
        if det["time_to_page_s"] is not None:  # a page after the injection: the burn explains it
            assert det["page_reached"] or det["page_marginal"], (d["name"], det)
        # every rule is accounted for: it fired, was already firing, or says why not
        for rule in det["rules"]:
            assert (
                rule.get("fired_s") is not None
                or rule.get("already_firing")
                or rule.get("why_silent")
            ), rule
        folder = run.out / d["name"]
        assert (folder / "detection.json").is_file()
        assert "## Detection" in (folder / "evidence.md").read_text(encoding="utf-8")
    # every drill's SLI reads the load client: its counters were scraped
    assert any(d["detection"]["burn_peak"] is not None for d in run.summary["drills"])
    # the server went down with the lab
    assert not (run.out / "lab" / "prometheus" / "prometheus.pid").exists()
    rows = {r["metric"]: r for r in build_scorecard(run.summary, run.out)["tiers"][0]["rows"]}
    assert rows["detection"]["passed"] is True, rows["detection"]
