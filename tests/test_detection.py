"""Detection without a running server: the burn-rate rules under ``promtool test rules``, the
figures from ALERTS samples, the judge, the exposition endpoint, and the command line's refusals
(the real server's tests: ``tests/test_detection_prometheus.py``)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from labutil import cli

from chaoslib_infer.lab import slo_rules
from chaoslib_infer.lab.exposition import ClientCounters
from chaoslib_infer.lab.prometheus_server import render_config
from chaoslib_infer.measure.detection import detection_figures, episodes, rule_selectors
from chaoslib_infer.verdict.detection import DetectionCriteria, judge_detection

PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package prometheus)")
@pytest.mark.parametrize(
    ("failed_per_min", "page", "ticket"),
    [
        (20, True, True),  # 2 % failed: 20x the 0.1 % budget, above 14.4x: a page
        (5, False, True),  # 0.5 %: 5x, under both page rates (14.4x, 6x): a ticket only
        (0, False, False),
    ],
)
def test_burn_rate_rules_page_and_ticket_at_the_workbook_rates(
    tmp_path: Path, failed_per_min: int, page: bool, ticket: bool
) -> None:
    """Real PromQL evaluation of the generated rules, one sample a minute for 80 minutes."""
    assert PROMTOOL is not None
    rules = tmp_path / "slo.yaml"
    rules.write_text(yaml.safe_dump(slo_rules.burn_rate_rules(0.999)), encoding="utf-8")
    c = slo_rules.CLIENT_REQUESTS
    ok = 1000 - failed_per_min
    doc = slo_rules.burn_rate_rules(0.999)
    annotations = {r["alert"]: r["annotations"] for r in doc["groups"][1]["rules"]}

    def expect(alert: str, fires: bool, severity: str) -> list[dict[str, Any]]:
        labels = {"layer": "slo", "severity": severity}
        return [{"exp_labels": labels, "exp_annotations": annotations[alert]}] if fires else []

    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f'{c}{{result="ok"}}', "values": f"0+{ok}x80"},
                    {"series": f'{c}{{result="failed"}}', "values": f"0+{failed_per_min}x80"},
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "70m",
                        "alertname": slo_rules.PAGE_ALERT,
                        "exp_alerts": expect(slo_rules.PAGE_ALERT, page, "page"),
                    },
                ],
            }
        ],
    }
    tests["tests"][0]["alert_rule_test"].append(  # type: ignore[index]
        {
            "eval_time": "70m",
            "alertname": slo_rules.TICKET_ALERT,
            "exp_alerts": expect(slo_rules.TICKET_ALERT, ticket, "ticket"),
        }
    )
    spec = tmp_path / "test.yaml"
    spec.write_text(yaml.safe_dump(tests), encoding="utf-8")
    proc = subprocess.run(
        [PROMTOOL, "test", "rules", str(spec)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_burn_rate_rules_refuse_bad_input() -> None:
    with pytest.raises(ValueError, match="slo must be in"):
        slo_rules.burn_rate_rules(1.0)
    with pytest.raises(ValueError, match="not a Prometheus duration"):
        slo_rules.burn_rate_rules(page=(slo_rules.BurnWindow("5 min", "1h", 14.4),))
    with pytest.raises(ValueError, match="placeholder"):
        slo_rules.burn_rate_rules(error_query="sum(rate(x[5m]))")


def test_rule_selectors_name_what_must_have_series() -> None:
    q = (
        'sum(rate(http_requests_total{handler=~"/v1/.*",status=~"5.."}[2m])) / '
        'sum by (instance) (rate(http_requests_total{handler=~"/v1/.*"}[2m])) > 0.005 '
        "and ignoring(slo_window) chaos_infer:sli_error:ratio_rate5m > 0"
    )
    assert rule_selectors(q) == [
        'http_requests_total{handler=~"/v1/.*",status=~"5.."}',
        'http_requests_total{handler=~"/v1/.*"}',
        "chaos_infer:sli_error:ratio_rate5m",
    ]
    assert rule_selectors("vector(1) > 0") == []


def _samples(
    alert: str, severity: str, pending: list[float], firing: list[float]
) -> list[dict[str, Any]]:
    labels = {"alertname": alert, "severity": severity}
    return [
        {"labels": {**labels, "alertstate": "pending"}, "t": pending},
        {"labels": {**labels, "alertstate": "firing"}, "t": firing},
    ]


RULES = [
    {"name": "Page", "duration": 2.0, "labels": {"severity": "page"}, "query": "x > 0"},
    {"name": "Slow", "duration": 300.0, "labels": {"severity": "page"}, "query": "y > 0"},
    {"name": "Noisy", "duration": 0.0, "labels": {"severity": "page"}, "query": "z > 0"},
    {"name": "Old", "duration": 0.0, "labels": {"severity": "page"}, "query": "w > 0"},
]


def _figures() -> dict[str, Any]:
    # drill 100..130 s, injection at 110, fault until 120; one evaluation a second
    samples = [
        *_samples("Page", "page", [111.0, 112.0], [113.0, 114.0, 115.0, 116.0]),
        *_samples("Slow", "page", [111.0 + i for i in range(9)], []),
        *_samples("Noisy", "page", [], [104.0, 105.0]),
        *_samples("Old", "page", [], [90.0 + i for i in range(13)]),  # active from before
    ]
    eps = episodes(samples, 1.0)
    return detection_figures(
        eps,
        RULES,
        drill_start=100.0,
        injection_at=110.0,
        fault_end_at=120.0,
        drill_end=130.0,
        interval_s=1.0,
        missing={"Slow": []},
    )


def test_detection_figures_place_each_alert_against_the_fault() -> None:
    det = _figures()
    assert det["time_to_detect_s"] == 3.0 and det["detected_by"] == "Page"
    assert det["condition_held_s"] == 1.0 and det["time_to_page_s"] == 3.0
    assert [a["alert"] for a in det["baseline_alarms"]] == ["Noisy"]
    assert det["baseline_alarms"][0]["firing_s"] == -6.0
    assert [a["alert"] for a in det["carried_over"]] == ["Old"]
    rules = {r["alert"]: r for r in det["rules"]}
    assert rules["Page"]["fault_long_enough"] is True and "why_silent" not in rules["Page"]
    slow = rules["Slow"]  # condition held from +1 s, for: 300 s: the 10 s fault was too short
    assert slow["fault_long_enough"] is False and slow["would_fire_s"] == 301.0
    assert "for: 300 s longer than the condition held" in slow["why_silent"]
    assert "a fault lasting 301 s would have fired it" in slow["why_silent"]


def test_judge_fails_silent_false_and_baseline_pages_and_passes_a_quiet_mitigated_fault() -> None:
    det = _figures()
    rows, reasons = judge_detection(det, 30.0, True, 14.4, baseline_burn=0.5)
    # paged by Page: not silent; burn at the page rate: no false page; Noisy paged in baseline
    assert reasons == [
        "detection: false alarm in the baseline, before any fault: Noisy at -6.0 s paged while "
        "the budget burned at 0.5x, under the page rate"
    ]
    # the same page while the baseline burned at a page rate (earlier drills' failures in the
    # long windows): due, not a false alarm
    rows, reasons = judge_detection(det, 30.0, True, 14.4, baseline_burn=20, baseline_reached=True)
    assert reasons == [] and rows[2]["result"] == "passed"
    # the same alerts while the burn stayed at 2x: Page is a false page
    rows, reasons = judge_detection(det, 2.0, False, 14.4)
    assert reasons[0].startswith("detection: false page: Page fired at +3.0 s")
    # the lab's own rules read the very counters the burn comes from: the same page is the
    # tool's disagreement (a well-run game day's jitter paged at +39.4 s on 3.9x), reported,
    # never a reason against the service
    rows, reasons = judge_detection(det, 2.0, False, 14.4, own_alerts=frozenset({"Page"}))
    own = {r["criterion"]: r for r in rows}["false_page"]
    assert not [r for r in reasons if r.startswith("detection: false page")], reasons
    assert own["result"] == "not judged" and "the tool's disagreement" in own["note"], own
    # within 10 % of the page rate: one evaluation decides, so no false page is judged
    rows, reasons = judge_detection(det, 13.5, False, 14.4, marginal=True)
    assert {r["criterion"]: r["result"] for r in rows}["false_page"] == "not judged"
    # only the team's Slow rule judged: its for: outlasted the fault, a silent page naming why
    rows, reasons = judge_detection(det, 30.0, True, 14.4, judged={"Slow"})
    silent = [r for r in reasons if "silent page" in r]
    assert silent and "Slow: for: 300 s longer than the condition held" in silent[0]
    # a quiet drill with the burn under the page rate passes every criterion
    quiet = {**det, "alerts": [], "baseline_alarms": []}
    rows, reasons = judge_detection(quiet, 1.0, False, 14.4)
    assert reasons == [] and {r["result"] for r in rows} == {"passed"}
    # a page still firing at the injection (an earlier drill's burn) has the fault covered:
    # no silent page, and it is no false page of this drill either
    carried = episodes(_samples("Old", "page", [], [95.0 + i for i in range(30)]), 1.0)
    kw = {"drill_start": 100.0, "injection_at": 110.0, "fault_end_at": 120.0, "drill_end": 130.0}
    det2 = detection_figures(carried, RULES, interval_s=1.0, **kw)
    assert det2["already_paging"] == ["Old"] and det2["time_to_page_s"] is None
    rows, reasons = judge_detection(det2, 30.0, True, 14.4)
    assert reasons == [], reasons
    assert "already paging at the injection: Old" in rows[0]["note"]
    # turned off: reported, not judged
    rows, reasons = judge_detection(det, 30.0, True, 14.4, DetectionCriteria(baseline_alarm=False))
    assert reasons == []


def test_detection_criteria_from_a_plan() -> None:
    c = DetectionCriteria.from_mapping({"false_page": "off", "early_warning": True})
    assert c == DetectionCriteria(false_page=False, early_warning=True)
    with pytest.raises(ValueError, match="unknown criterion 'silent'"):
        DetectionCriteria.from_mapping({"silent": "off"})
    with pytest.raises(ValueError, match="expected on or off"):
        DetectionCriteria.from_mapping({"silent_page": 3})


def test_client_counters_count_logical_requests_and_wait_for_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    recs = [
        {
            "request_id": "a",
            "attempt": 1,
            "final": False,
            "ok": False,
            "sent_at": 1.0,
            "end_at": 1.2,
        },
        {"request_id": "a", "attempt": 2, "final": True, "ok": True, "sent_at": 1.3, "end_at": 1.6},
        {"request_id": "b", "attempt": 1, "final": True, "ok": False, "sent_at": 2.0, "end_at": 17},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"request_id": "c", "ok"')
    c = ClientCounters()
    c.follow(path)
    text = c.exposition()
    assert 'chaos_infer_client_requests_total{result="ok"} 1' in text
    assert 'chaos_infer_client_requests_total{result="failed"} 1' in text
    assert 'chaos_infer_client_attempts_total{result="failed"} 2' in text
    assert 'chaos_infer_client_e2e_seconds_bucket{le="0.25"} 0' in text
    assert 'chaos_infer_client_e2e_seconds_bucket{le="0.5"} 1' in text
    with path.open("a") as fh:  # the half-written line completes: counted once, at its end
        fh.write(': true, "final": true, "sent_at": 3.0, "end_at": 3.1}\n')
    c.follow(tmp_path / "next.jsonl")  # the next drill: totals carry on
    assert 'chaos_infer_client_requests_total{result="ok"} 2' in c.exposition()


def test_prometheus_config_states_the_interval_and_every_job(tmp_path: Path) -> None:
    doc = yaml.safe_load(
        render_config(
            0.5,
            {
                "engine": ["127.0.0.1:1/metrics", "127.0.0.1:2/metrics"],
                "lab": ["127.0.0.1:3/m/lab"],
            },
            [tmp_path / "r.yaml"],
        )
    )
    assert doc["global"] == {"scrape_interval": "500ms", "evaluation_interval": "500ms"}
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert jobs["engine"]["static_configs"][0]["targets"] == ["127.0.0.1:1", "127.0.0.1:2"]
    assert jobs["lab"]["metrics_path"] == "/m/lab"


def test_gameday_refuses_a_bad_prometheus_url_and_bad_rules_before_any_fault(
    tmp_path: Path,
) -> None:
    proc = cli(
        "gameday", "--out", str(tmp_path / "a"), "--prometheus", "http://127.0.0.1:9", timeout=120
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "chaos-infer: error: --prometheus: http://127.0.0.1:9"
    )
    assert "Traceback" not in proc.stderr and not (tmp_path / "a" / "lab").exists()
    proc = cli("gameday", "--out", str(tmp_path / "b"), "--prometheus", "ftp://x", timeout=120)
    assert proc.returncode == 2 and "is not an http(s) URL" in proc.stderr
    if PROMTOOL is None:
        return
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: sum(rate(x[5m]) > \n")
    proc = cli("gameday", "--out", str(tmp_path / "c"), "--rules", str(bad), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"chaos-infer: error: --rules {bad}: promtool")
    assert not (tmp_path / "c" / "lab").exists()


def test_scaled_windows_keep_the_factors_and_the_one_to_twelve_ratio() -> None:
    page = slo_rules.scaled(slo_rules.PAGE_WINDOWS, 60)
    assert page == (
        slo_rules.BurnWindow("5s", "60s", 14.4),
        slo_rules.BurnWindow("30s", "360s", 6.0),
    )
    assert slo_rules.scaled(slo_rules.PAGE_WINDOWS, 1) == slo_rules.PAGE_WINDOWS
    with pytest.raises(ValueError, match="window_scale must be >= 1"):
        slo_rules.scaled(slo_rules.PAGE_WINDOWS, 0.5)


def test_plan_detection_reads_the_plan_and_refuses_bad_keys(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from chaoslib_infer.errors import ConfigError
    from chaoslib_infer.evidence.detection_plan import plan_detection

    def plan(detection: Any) -> Any:
        path = tmp_path / "plan.yaml"
        path.write_text(yaml.safe_dump({"drills": [], "detection": detection}), encoding="utf-8")
        return SimpleNamespace(path=path)

    got = plan_detection(
        plan({"window_scale": 60, "false_page": "off", "interval_s": 2}), None, None
    )
    assert got.window_scale == 60 and got.interval_s == 2.0 and got.prometheus is None
    assert got.criteria == DetectionCriteria(false_page=False)
    for bad, why in (
        ({"window_scale": 0}, "window_scale must be >= 1"),
        ({"interval_s": 0}, "interval_s must be within"),
        ({"silent": "off"}, "unknown criterion 'silent'"),
        ("yes", "detection: expected a mapping"),
    ):
        with pytest.raises(ConfigError, match=why):
            plan_detection(plan(bad), None, None)


def test_oom_kill_early_warning_is_reported_and_judged_only_when_asked() -> None:
    det = {
        "alerts": [],
        "rules": [{"alert": "GPUMemoryHigh", "severity": "page", "condition_held_s": 2.0}],
    }
    rows, reasons = judge_detection(det, 1.0, False, 14.4, oom_kill_at_s=12.0)
    ew = {r["criterion"]: r for r in rows}["early_warning"]
    assert ew["result"] == "not judged" and ew["value"] == 10.0
    assert "held 10.0 s before the kill" in ew["note"] and reasons == []
    late = {**det, "rules": [{**det["rules"][0], "condition_held_s": 13.0}]}
    on = DetectionCriteria(early_warning=True)
    rows, reasons = judge_detection(late, 1.0, False, 14.4, on, oom_kill_at_s=12.0)
    assert reasons == [
        "detection: no early warning: no memory alert's condition held before the kill"
    ]


def test_without_the_prometheus_binary_the_game_day_goes_on_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from chaoslib_infer.evidence import detection_plan
    from chaoslib_infer.lab import prometheus_server

    monkeypatch.setattr(prometheus_server, "find_prometheus", lambda: None)
    lines: list[str] = []
    got = detection_plan.start_detection(detection_plan.DetectionPlan(), object(), {}, lines.append)
    assert got == (None, None)
    assert lines == ["detection: skipped, prometheus is not installed (Debian package prometheus)"]
    # turned off in the plan: nothing started, nothing said
    lines.clear()
    off = detection_plan.DetectionPlan(enabled=False)
    assert detection_plan.start_detection(off, object(), {}, lines.append) == (None, None)
    assert lines == []
