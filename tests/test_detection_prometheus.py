"""Detection against a real Prometheus server (Debian's ``prometheus``, started here; no stub).

The load client's counters come from attempt records written the way the load process writes
them (one flushed JSON line per attempt) and served by the lab's exposition endpoint; the server
scrapes them every 0.5 s and evaluates the SLO's burn-rate rules (windows shortened to seconds,
as a drill's fault lasts seconds) and a test rule file: a rule with a short ``for:``, one with a
wrong metric name. The judge reads ``ALERTS`` back over the HTTP API.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaoslib_infer.evidence.detection import DetectionSetup, drill_detection
from chaoslib_infer.lab import prometheus_server as ps
from chaoslib_infer.lab import slo_rules
from chaoslib_infer.lab.exposition import LabExporter
from chaoslib_infer.verdict.detection import DetectionCriteria

pytestmark = [
    pytest.mark.slow,  # two servers, ~40 s of driven traffic in all
    pytest.mark.skipif(ps.find_prometheus() is None, reason="needs Debian's prometheus package"),
]

INTERVAL = 0.5
SLO = 0.99  # a 1 % budget: the 14.4x page rate is a 14.4 % failed share
PAGE = (slo_rules.BurnWindow("2s", "4s", 14.4),)
TEST_RULES = {
    "groups": [
        {
            "name": "team",
            "rules": [
                {  # fires on any failed request held for 2 s: a naive team rule
                    "alert": "TeamAnyErrors",
                    "expr": 'sum(rate(chaos_infer_client_requests_total{result="failed"}[2s])) > 0',
                    "for": "2s",
                    "labels": {"severity": "page"},
                },
                {  # a typo in the metric name: can never fire
                    "alert": "TeamTypoErrors",
                    "expr": 'sum(rate(chaos_infer_client_request_total{result="failed"}[2s])) > 0',
                    "labels": {"severity": "page"},
                },
                {  # the right metric, a label value that never occurs
                    "alert": "TeamWrongLabel",
                    "expr": 'sum(rate(chaos_infer_client_requests_total{result="error"}[2s])) > 0',
                    "labels": {"severity": "ticket"},
                },
            ],
        }
    ]
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("prom")
    exporter = LabExporter(lambda: {})
    burn = d / "burn.yaml"
    burn.write_text(
        yaml.safe_dump(slo_rules.burn_rate_rules(SLO, page=PAGE, ticket=())), encoding="utf-8"
    )
    team = d / "team.yaml"
    team.write_text(yaml.safe_dump(TEST_RULES), encoding="utf-8")
    jobs = {"client": [f"127.0.0.1:{exporter.port}/metrics/client"]}
    srv = ps.start(d, jobs, [burn, team], INTERVAL)
    yield srv, exporter, d
    srv.stop()
    exporter.close()
    assert not Path(f"/proc/{srv.pid}").exists()


def _drive(path: Path, phases: list[tuple[float, float]], rate: float = 40.0) -> list[float]:
    """Write attempt records at ``rate``/s through ``phases`` of ``(seconds, failed share)``;
    return each phase's start (unix s) and the end."""
    marks: list[float] = []
    n = 0
    with path.open("a", encoding="utf-8") as fh:
        for seconds, failed in phases:
            start = time.time()
            marks.append(start)
            k = 0
            while time.time() < start + seconds:
                k += 1
                bad = failed > 0 and (k * failed) % 1.0 < failed  # an even spread
                now = time.time()
                rec = {"request_id": f"q{n}", "attempt": 1, "final": True, "ok": not bad}
                rec |= {"sent_at": now - 0.05, "end_at": now, "status": 500 if bad else 200}
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                n += 1
                time.sleep(1.0 / rate)
    marks.append(time.time())
    return marks


def _entry(marks: list[float]) -> dict[str, Any]:
    base, inj, fault_end, end = marks
    return {
        "status": "passed",
        "reasons": [],
        "ground_truth": {"fault_at": inj},
        "verdict": {
            "windows": {
                "baseline": {"start": base, "end": inj},
                "fault": {"start": inj, "end": fault_end},
                "after": {"start": fault_end, "end": end},
            }
        },
    }


def _setup(url: str) -> DetectionSetup:
    page = tuple((w.short, w.long, w.factor) for w in PAGE)
    return DetectionSetup(url, INTERVAL, "lab", DetectionCriteria(), SLO, page)


def test_a_fault_that_pages_and_a_mitigated_one_that_must_not(server: Any) -> None:
    srv, exporter, d = server
    # 1. every request fails for 4 s: the burn-rate page fires, the team's 2 s rule too
    records = d / "drill1.jsonl"
    exporter.follow(records)
    marks = _drive(records, [(3.0, 0.0), (4.0, 1.0), (2.5, 0.0)])
    det = drill_detection(_setup(srv.url), _entry(marks), [])
    assert det.get("error") is None, det
    assert det["baseline_alarms"] == [] and det["carried_over"] == []
    assert det["page_reached"] and det["burn_peak"] > 14.4
    assert det["paged_by"] in ("AvailabilityBurnRatePage", "TeamAnyErrors")
    rules = {r["alert"]: r for r in det["rules"]}
    team = rules["TeamAnyErrors"]
    # its condition held soon after the injection, and it fired its for: later, within one
    # evaluation interval (ALERTS is written at evaluations)
    assert 0 <= team["condition_held_s"] <= 4 * INTERVAL, team
    assert 2.0 - 1e-3 <= team["fired_s"] - team["condition_held_s"] <= 2.0 + INTERVAL + 0.05
    assert team["fault_long_enough"] is True
    assert rules["AvailabilityBurnRatePage"]["fired_s"] is not None
    assert det["time_to_detect_s"] == min(
        r["fired_s"] for r in det["rules"] if r["fired_s"] is not None
    )
    # the typo rule is reported silent for the missing metric, the wrong label for its selector
    assert "no metric chaos_infer_client_request_total" in rules["TeamTypoErrors"]["why_silent"]
    assert (
        'no series matches chaos_infer_client_requests_total{result="error"}'
        in (rules["TeamWrongLabel"]["why_silent"])
    )
    assert det["reasons"] == []  # paged: not silent; burned at the page rate: not false
    assert det["read_s"] < 5.0, det["read_s"]  # a game day must not get much slower
    print(f"\ndetection read in {det['read_s']:.3f} s")
    # --prometheus URL (a server that does not scrape our client): the same alerts, the burn
    # from the drill's own records over the fault window
    recs = [json.loads(line) for line in records.read_text().splitlines()]
    ext = DetectionSetup(srv.url, INTERVAL, "external", DetectionCriteria(), SLO, _setup("").page)
    det_ext = drill_detection(ext, _entry(marks), recs)
    assert det_ext["source"] == "external" and det_ext["page_reached"]
    assert det_ext["burn_peak"] == pytest.approx(1.0 / (1 - SLO), rel=0.05)  # all failed
    assert det_ext["paged_by"] == det["paged_by"] and det_ext["reasons"] == []
    # 2. a mitigated fault: 4 % of requests fail (4x burn, under 14.4x): the SLO page stays
    # quiet, the naive team rule pages anyway, judged a false page
    records2 = d / "drill2.jsonl"
    exporter.follow(records2)
    marks = _drive(records2, [(4.5, 0.0), (4.0, 0.04), (1.0, 0.0)])
    det2 = drill_detection(_setup(srv.url), _entry(marks), [])
    assert det2["baseline_alarms"] == [], det2["baseline_alarms"]
    assert not det2["page_reached"] and det2["burn_peak"] < 14.4
    fired = {a["alert"] for a in det2["alerts"] if a["firing_s"] is not None}
    assert "AvailabilityBurnRatePage" not in fired
    assert "TeamAnyErrors" in fired
    assert any(r.startswith("detection: false page: TeamAnyErrors") for r in det2["reasons"])


def test_a_silent_page_names_the_rule_and_why(tmp_path: Path) -> None:
    """A server whose only page rule has a typo in its metric name: a fault that burns the budget
    at the page rate goes unpaged, and the drill fails naming the rule and the missing metric."""
    exporter = LabExporter(lambda: {})
    typo = {"groups": [{"name": "team", "rules": [TEST_RULES["groups"][0]["rules"][1]]}]}
    rules = tmp_path / "typo.yaml"
    rules.write_text(yaml.safe_dump(typo), encoding="utf-8")
    srv = ps.start(
        tmp_path, {"client": [f"127.0.0.1:{exporter.port}/metrics/client"]}, [rules], INTERVAL
    )
    try:
        records = tmp_path / "records.jsonl"
        exporter.follow(records)
        marks = _drive(records, [(2.0, 0.0), (3.0, 1.0), (1.0, 0.0)])
        det = drill_detection(_setup(srv.url), _entry(marks), [])
    finally:
        srv.stop()
        exporter.close()
    assert det["page_reached"] and det["alerts"] == []
    assert det["time_to_detect_s"] is None and det["time_to_page_s"] is None
    assert len(det["reasons"]) == 1, det["reasons"]
    reason = det["reasons"][0]
    assert reason.startswith("detection: silent page: the fault burned the error budget at")
    assert "TeamTypoErrors: no metric chaos_infer_client_request_total" in reason
    rows = {r["criterion"]: r["result"] for r in det["rows"]}
    assert rows == {"silent_page": "failed", "false_page": "passed", "baseline_alarm": "passed"}
