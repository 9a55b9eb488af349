"""Scorecard in three priority tiers, from a hand-made summary and records (exact arithmetic)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from chaoslib_infer.evidence.render import render_index
from chaoslib_infer.evidence.scorecard import build_scorecard, drill_load_stats

T0 = 1_800_000_000.0


def _records(n_ok: int, n_failed: int, span_s: float, tokens: int) -> list[dict[str, Any]]:
    """``n_ok`` successes and ``n_failed`` failures spread evenly; load span exactly ``span_s``."""
    out = []
    n = n_ok + n_failed
    for i in range(n):
        sent = T0 + i * (span_s - 0.5) / max(n - 1, 1)
        ok = i >= n_failed
        out.append(
            {
                "request_id": f"r{i}",
                "attempt": 1,
                "final": True,
                "intended_at": sent,
                "sent_at": sent,
                "status": 200 if ok else 503,
                "ok": ok,
                "error_class": None if ok else "http_5xx",
                "error": None,
                "first_byte_at": sent + 0.1,
                "first_token_at": sent + 0.1,
                "chunk_times": [sent + 0.1],
                "end_at": sent + 0.5,
                "output_tokens": tokens if ok else 0,
                "tokens_source": "usage",
                "replica": "r0",
                "text_len": 10,
            }
        )
    return out


def _drill(name: str, requests: int, err: float, p50: float, p99: float, after: bool | None,
           **extra: Any) -> dict[str, Any]:  # fmt: skip
    return {
        "name": name,
        "status": "passed" if after else "failed",
        "hypothesis": {"before": True, "after": after},
        "started_at": "2027-01-15T08:00:00+00:00",
        "ended_at": "2027-01-15T08:00:50+00:00",
        "figures": {
            "requests": requests,
            "availability": 1 - err,
            "error_rate": err,
            "p50_e2e_s": p50,
            "p99_e2e_s": p99,
            **extra,
        },
        "evidence": f"{name}/evidence.md",
    }


def _run(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    run = tmp_path / "run"
    for name, recs in (
        ("node-loss", _records(196, 4, 20.0, 30)),
        ("quota-cut", _records(100, 0, 10.0, 10)),
    ):
        (run / name).mkdir(parents=True)
        (run / name / "records.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8"
        )
    summary = {
        "plan": "synthetic",
        "target": {"kind": "lab", "engine": "sim", "replicas": 4},
        "started_at": "2027-01-15T08:00:00+00:00",
        "ended_at": "2027-01-15T08:02:00+00:00",
        "complete": True,
        "drills": [
            _drill(
                "node-loss",
                200,
                0.02,
                0.4,
                3.5,
                False,
                recovery_s=42.0,
                interruption_s=3.0,
                budget_cost_s=25.92,
                budget_share=0.01,
            ),
            _drill(
                "quota-cut",
                100,
                0.0,
                0.6,
                1.2,
                True,
                interruption_s=7.5,
                budget_cost_s=0.0,
                budget_share=0.0,
            ),
            # no records: QPS falls back to the summary (requests x availability / drill time)
            _drill("traffic-spike", 300, 0.0, 2.5, 12.0, True, restart_s=1.0),
        ],
    }
    return run, summary


def test_load_stats_from_records(tmp_path: Path) -> None:
    run, _ = _run(tmp_path)
    stats = drill_load_stats(run / "node-loss")
    assert stats is not None
    assert stats["ok"] == 196 and stats["attempts"] == 200
    assert stats["load_s"] == pytest.approx(20.0)
    assert stats["qps"] == pytest.approx(196 / 20.0)
    assert stats["mean_output_tokens"] == 30
    assert drill_load_stats(run / "traffic-spike") is None


def test_tiers_in_the_seed_order_with_exact_figures(tmp_path: Path) -> None:
    run, summary = _run(tmp_path)
    card = build_scorecard(summary, run)
    assert [(t["tier"], t["name"]) for t in card["tiers"]] == [
        (1, "Stability"),
        (2, "Performance and cost"),
        (3, "Model quality"),
    ]
    stab = {r["metric"]: r for r in card["tiers"][0]["rows"]}
    assert list(stab) == [
        "error rate",
        "P99 E2E latency",
        "recovery time",
        "error-budget cost",
        "disaster tolerance",
    ]
    # the faults' budget shares summed (1 % + 0 %), below the month's budget; the spike's cost
    # unmeasured, named, never 0
    budget = stab["error-budget cost"]
    assert budget["value"] == pytest.approx(0.01) and budget["passed"] is True
    assert "worst drill: node-loss (25.9 s of full outage, 1.000%)" in budget["note"]
    assert budget["note"].endswith("unmeasured: traffic-spike")
    assert stab["error rate"]["value"] == pytest.approx(4 / 600)  # 0.02 x 200 of 600 requests
    # under the default verdict policy shown, not judged: each drill judged its fault's cost
    # against the error budget (found by a new-user trial: Tier 1 read failed on losses the
    # drills passed); under strict (zero loss) judged against the acceptance SLO (< 0.1 %)
    assert stab["error rate"]["passed"] is None
    assert "not judged under the default verdict policy" in stab["error rate"]["note"]
    summary["drills"][0]["verdict_policy"] = {"name": "strict"}
    strict = {r["metric"]: r for r in build_scorecard(summary, run)["tiers"][0]["rows"]}
    assert strict["error rate"]["passed"] is False
    assert "not judged" not in strict["error rate"]["note"]
    assert stab["P99 E2E latency"]["value"] == 12.0 and stab["P99 E2E latency"]["passed"] is False
    # recovery_s only, never another figure: the drills without one are named unmeasured
    assert stab["recovery time"]["value"] == 42.0 and stab["recovery time"]["passed"] is True
    assert stab["recovery time"]["note"] == (
        "worst drill: node-loss (recovery_s); unmeasured: quota-cut, traffic-spike"
    )
    assert stab["disaster tolerance"]["value"] == pytest.approx(2 / 3)
    assert stab["disaster tolerance"]["passed"] is False
    assert stab["disaster tolerance"]["note"] == "2 of 3 judged drills passed"
    assert card["tiers"][0]["verdict"] == "FAIL"
    drills = {d["name"]: d for d in card["tiers"][0]["drills"]}
    assert (drills["quota-cut"]["recovery_s"], drills["quota-cut"]["recovery_figure"]) == (
        None,
        "recovery_s (unmeasured)",
    )
    assert drills["traffic-spike"]["recovery_figure"] == "recovery_s (unmeasured)"
    assert drills["traffic-spike"]["qps_source"] == "summary"
    assert drills["traffic-spike"]["qps"] == pytest.approx(300 / 50.0)

    perf = {r["metric"]: r for r in card["tiers"][1]["rows"]}
    assert perf["QPS (achieved)"]["value"] == pytest.approx(100 / 10.0)  # quota-cut's 10 req/s
    assert perf["QPS (achieved)"]["passed"] is None
    assert perf["P50 E2E latency"]["value"] == 2.5 and perf["P50 E2E latency"]["passed"] is False
    assert perf["cost per request"]["value"] is None
    assert "no price given" in perf["cost per request"]["note"]
    tier3 = card["tiers"][2]
    assert tier3["out_of_scope"] is True and tier3["verdict"] == "OUT OF SCOPE"
    assert "not the model" in tier3["note"]


def test_cost_per_request(tmp_path: Path) -> None:
    run, summary = _run(tmp_path)
    per_token = build_scorecard(summary, run, {"price_per_1k_tokens": 0.5})
    cost = next(r for r in per_token["tiers"][1]["rows"] if r["metric"] == "cost per request")
    mean_tokens = (196 * 30 + 100 * 10) / 296
    assert cost["value"] == pytest.approx(0.5 * mean_tokens / 1000)
    assert cost["unit"] == "USD"
    summary["pricing"] = {"price_per_instance_hour": 3.6, "currency": "EUR"}
    per_hour = build_scorecard(summary, run)
    cost = next(r for r in per_hour["tiers"][1]["rows"] if r["metric"] == "cost per request")
    # 3.6 EUR/h x 4 instances x 30 s of load / 296 successful requests
    assert cost["value"] == pytest.approx(3.6 * 4 * (30 / 3600) / 296)
    assert cost["unit"] == "EUR"


def test_index_html_shows_the_scorecard_self_contained(tmp_path: Path) -> None:
    run, summary = _run(tmp_path)
    summary["pricing"] = {"price_per_1k_tokens": 0.5}
    html = render_index(run, summary, "DEVIATED").read_text(encoding="utf-8")
    assert html.index("Tier 1: Stability — FAIL") < html.index("Tier 2: Performance and cost")
    assert html.index("Tier 2") < html.index("Tier 3: Model quality — OUT OF SCOPE")
    # ratios as percentages: error rate 4/600, disaster tolerance 2/3
    assert "<td>error rate</td><td>0.6667 %</td>" in html
    assert "<td>disaster tolerance</td><td>66.67 %</td>" in html
    assert "2 of 3 judged drills passed" in html
    assert "per 1k output tokens" in html
    assert '<a href="node-loss/evidence.html">' in html
    # self-contained: nothing fetched from elsewhere
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "<script" not in html and "<link" not in html


def test_recovery_time_reads_unmeasured_without_a_recovery_figure(tmp_path: Path) -> None:
    """No drill measured a recovery time: the row reads unmeasured (not judged), never an
    interruption or a restart time standing in for it, nor a never-sustained interruption
    read as never recovered."""
    run, summary = _run(tmp_path)
    for d in summary["drills"]:
        d["figures"].pop("recovery_s", None)
    summary["drills"][0]["figures"]["interruption_sustained"] = False
    stab = {r["metric"]: r for r in build_scorecard(summary, run)["tiers"][0]["rows"]}
    row = stab["recovery time"]
    assert (row["value"], row["passed"]) == (None, None)
    assert row["note"] == "unmeasured: no drill measured a recovery time (recovery_s)"
    drills = {d["name"]: d for d in build_scorecard(summary, run)["tiers"][0]["drills"]}
    assert not drills["node-loss"]["never_recovered"]
    assert drills["node-loss"]["recovery_figure"] == "recovery_s (unmeasured)"


def test_empty_summary_has_no_data_verdicts() -> None:
    card = build_scorecard({"drills": []})
    assert [t["verdict"] for t in card["tiers"]] == ["NO DATA", "NO DATA", "OUT OF SCOPE"]
    assert all(r["value"] is None for r in card["tiers"][0]["rows"])


def _graded(*statuses: str) -> dict[str, Any]:
    """A game day whose drills ended in ``statuses``, every figure inside its reference (error
    rate 0, P99 1 s, P50 0.3 s, recovery 2 s): only the states can keep a tier from PASS."""
    drills = []
    for i, status in enumerate(statuses):
        d = _drill(f"d{i}", 100, 0.0, 0.3, 1.0, status == "passed", recovery_s=2.0)
        d["status"] = status
        drills.append(d)
    return {"plan": "graded", "target": {"kind": "lab"}, "drills": drills}


def test_a_game_day_of_inconclusive_drills_never_reads_pass(tmp_path: Path) -> None:
    # every drill inconclusive: nothing was judged, so nothing passed (it read "Stability: PASS"
    # with "0 of 0 judged drills passed")
    card = build_scorecard(_graded("inconclusive", "inconclusive", "inconclusive"))
    stab, perf = card["tiers"][0], card["tiers"][1]
    assert (stab["verdict"], perf["verdict"]) == ("INCONCLUSIVE", "INCONCLUSIVE")
    assert stab["not_judged"] == perf["not_judged"] == 3
    rows = {r["metric"]: r for r in stab["rows"]}
    tolerance = rows["disaster tolerance"]
    assert tolerance["value"] == 0.0 and tolerance["passed"] is None  # 0 of 3 drills run
    assert tolerance["note"] == "0 of 0 judged drills passed; not judged: 3 (inconclusive 3)"
    # the figures themselves are inside their references: only the states keep it from PASS
    assert rows["error rate"]["passed"] is None and rows["P99 E2E latency"]["passed"] is True
    html = render_index(tmp_path, _graded("inconclusive", "error"), "INCONCLUSIVE").read_text()
    assert "Tier 1: Stability — INCONCLUSIVE (not judged: 2)" in html
    assert "not judged: 2 (error 1, inconclusive 1)" in html
    assert "— PASS" not in html


@pytest.mark.parametrize(
    ("statuses", "stability", "performance", "value", "note"),
    [
        (("passed", "passed", "passed"), "PASS", "PASS", 1.0, "3 of 3 judged drills passed"),
        (
            ("passed", "passed", "error"),
            "INCONCLUSIVE",
            "INCONCLUSIVE",
            2 / 3,
            "2 of 2 judged drills passed; not judged: 1 (error 1)",
        ),
        (
            ("passed", "aborted", "inconclusive"),
            "INCONCLUSIVE",
            "INCONCLUSIVE",
            1 / 3,
            "1 of 1 judged drills passed; not judged: 2 (aborted 1, inconclusive 1)",
        ),
        # a failure outranks what was not judged; tier 2 (P50 inside its reference) stays grey
        (
            ("failed", "inconclusive", "passed"),
            "FAIL",
            "INCONCLUSIVE",
            1 / 3,
            "1 of 2 judged drills passed; not judged: 1 (inconclusive 1)",
        ),
        # "deviated" (the older name of failed) is judged, and failed
        (("passed", "deviated"), "FAIL", "PASS", 0.5, "1 of 2 judged drills passed"),
    ],
)
def test_only_passed_drills_count_as_held_and_grey_keeps_every_tier_from_pass(
    statuses: tuple[str, ...], stability: str, performance: str, value: float, note: str
) -> None:
    card = build_scorecard(_graded(*statuses))
    assert [t["verdict"] for t in card["tiers"][:2]] == [stability, performance]
    tolerance = next(r for r in card["tiers"][0]["rows"] if r["metric"] == "disaster tolerance")
    assert tolerance["value"] == pytest.approx(value) and tolerance["note"] == note
    assert tolerance["passed"] is {"PASS": True, "FAIL": False, "INCONCLUSIVE": None}[stability]


def test_error_rate_counts_a_retried_request_by_its_final_outcome() -> None:
    # 200 attempts, 10 failed (5 %), but the client's retries served every one of the 190
    # logical requests (request_availability 1.0): users felt no error
    retried = _drill(
        "network-jitter", 200, 0.05, 0.5, 1.0, True, request_availability=1.0, logical_requests=190
    )
    plain = _drill("quota-cut", 100, 0.02, 0.5, 1.0, True)  # no retries: attempts are requests
    card = build_scorecard({"drills": [retried, plain]}, None)
    stab = {r["metric"]: r for r in card["tiers"][0]["rows"]}
    assert stab["error rate"]["value"] == pytest.approx(2 / 290)
    assert "final outcome" in stab["error rate"]["note"]
    # a retried drill that still lost requests counts them once each
    retried["figures"]["request_availability"] = 0.99
    card = build_scorecard({"drills": [retried]}, None)
    stab = {r["metric"]: r for r in card["tiers"][0]["rows"]}
    assert stab["error rate"]["value"] == pytest.approx(0.01)
