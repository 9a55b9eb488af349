"""Steady-state windows with stated error rates (issue 21 item 2): the exact binomial test of
``measure/binomial.py``, against hand-computed values and seeded simulations; the SLO probe
(``slo_check``) and the verdict's baseline judged by it, their reasons stating the rates.

Hand computations (``docs/definitions.md``, "Windows with stated error rates"):

- n = 140 at 99.9 %: P[X >= 1] = 1 - 0.999^140 = 0.1307 (one failure 13 % of the time);
  P[X >= 2] = 1 - 0.999^140 - 140 * 0.001 * 0.999^139 = 0.00888;
- P[X >= 1] = 1 - 0.999^n <= 0.05 up to n = 51 (0.0497); n = 52: 0.0507, so k = 2 from 52;
- a 2 % defect at k = 2: 1 - 0.98^n - n * 0.02 * 0.98^(n - 1) is 0.8997 at n = 193 and 0.9016
  at n = 194: 194 requests, 25 s at 8 req/s;
- Binomial(10, 0.5): P[X >= 8] = (45 + 10 + 1) / 1024.
"""

from __future__ import annotations

import math
import random
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from test_verdict_unit import attempt, steady, write_run

from chaoslib_infer.activities.slo import slo_check
from chaoslib_infer.evidence.verdicts import hypothesis_failures, window_settings
from chaoslib_infer.measure.binomial import (
    binom_sf,
    critical_count,
    defect_rate,
    judge_window,
    plan_settings,
    required_requests,
    window_seconds,
)
from chaoslib_infer.verdict import DrillFacts, judge_drill


def exact_sf(k: int, n: int, p: Fraction) -> Fraction:
    """The tail in exact rational arithmetic (the definition, term by term)."""
    return sum((math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1)), Fraction(0))


# -- the tail ----------------------------------------------------------------------------------


def test_the_tail_matches_hand_computed_values() -> None:
    assert binom_sf(1, 140, 0.001) == pytest.approx(1 - 0.999**140, rel=1e-12)
    assert binom_sf(1, 140, 0.001) == pytest.approx(0.1307, abs=5e-5)
    two = 1 - 0.999**140 - 140 * 0.001 * 0.999**139
    assert binom_sf(2, 140, 0.001) == pytest.approx(two, rel=1e-9)
    assert binom_sf(8, 10, 0.5) == pytest.approx(56 / 1024, rel=1e-12)
    assert (binom_sf(0, 5, 0.3), binom_sf(6, 5, 0.3), binom_sf(1, 5, 0.0)) == (1.0, 0.0, 0.0)
    assert binom_sf(5, 5, 1.0) == 1.0


@pytest.mark.parametrize(
    ("n", "p"),
    [(7, Fraction(1, 3)), (64, Fraction(1, 1000)), (200, Fraction(1, 50)), (90, Fraction(1, 2))],
)
def test_the_tail_equals_the_exact_rational_sum_on_both_sides_of_the_mean(
    n: int, p: Fraction
) -> None:
    for k in range(0, n + 2):
        assert binom_sf(k, n, float(p)) == pytest.approx(
            float(exact_sf(k, n, p)), rel=1e-9, abs=1e-300
        )


def test_the_tail_neither_overflows_nor_cancels_on_large_windows() -> None:
    # far in the upper tail: summed directly, not as 1 - (almost 1)
    tiny = binom_sf(30, 1000, 0.001)
    assert 0 < tiny < 1e-30
    assert binom_sf(50_000, 100_000, 0.5) == pytest.approx(0.5 + 0.5 * 0.002523, rel=1e-3)
    with pytest.raises(ValueError, match="0 <= p <= 1"):
        binom_sf(1, 10, 1.5)


# -- the rule: the critical count, its false-alarm rate and power ------------------------------


def test_the_critical_count_keeps_the_false_alarm_within_the_bound() -> None:
    # never fewer than 2 where the SLO allows failures (one failure in 51 is 4.97 % at 99.9 %)
    assert [critical_count(n, 0.001) for n in (50, 51, 52, 140, 355, 356)] == [2, 2, 2, 2, 2, 3]
    for n in (52, 140, 356, 1000):
        k = critical_count(n, 0.001)
        assert binom_sf(k, n, 0.001) <= 0.05 < binom_sf(k - 1, n, 0.001)
    assert binom_sf(1, 51, 0.001) <= 0.05 and binom_sf(2, 51, 0.001) == pytest.approx(
        0.00123, abs=1e-5
    )
    assert critical_count(100, 0.0) == 1  # an SLO of 100 %: any failure fails
    assert critical_count(100, 1.0) == 101  # allows everything: the window cannot fail
    assert critical_count(3, 0.5) == 4  # P50 over 3 requests: all 3 over is 12.5 % > 5 %
    assert critical_count(200, 0.001, false_alarm=0.2) == 2  # a looser bound: still 2
    assert critical_count(2000, 0.001, false_alarm=0.2) == 4  # larger windows step as before


def test_a_powered_window_needs_194_requests_at_three_nines() -> None:
    def power(n: int) -> float:
        return 1 - 0.98**n - n * 0.02 * 0.98 ** (n - 1)

    assert power(193) < 0.9 <= power(194)  # by hand, k = 2
    assert required_requests(0.001) == 194
    assert window_seconds(8.0, 0.001) == 25.0  # 194 / 8 = 24.25, rounded up
    assert defect_rate(0.001) == 0.02 and defect_rate(0.5) == pytest.approx(0.52)
    with pytest.raises(ValueError, match="rate above 0"):
        window_seconds(0.0, 0.001)


def test_one_failure_in_200_meets_three_nines_and_five_do_not() -> None:
    one, five = judge_window(200, 1, 0.001), judge_window(200, 5, 0.001)
    assert one.passed and not five.passed
    assert one.fails_at == five.fails_at == 2
    by_hand = 1 - 0.999**200 - 200 * 0.001 * 0.999**199
    assert one.false_alarm == pytest.approx(by_hand, rel=1e-9)  # 1.75 %
    assert one.power == pytest.approx(1 - 0.98**200 - 200 * 0.02 * 0.98**199, rel=1e-9)
    assert one.powered and one.needed == 194
    assert five.statement("failed") == (
        "5 failed of 200: fails at 2 or more failed of 200 (false alarm 1.7 % at the SLO, "
        "bound 5 %); catches a 2 % defect 91 % of the time at n=200"
    )


def test_a_short_window_is_judged_and_says_its_power() -> None:
    short = judge_window(64, 1, 0.001)
    assert short.passed and not short.powered
    assert short.power == pytest.approx(1 - 0.98**64 - 64 * 0.02 * 0.98**63, rel=1e-9)
    assert short.power_text() == (
        "catches a 2 % defect only 37 % of the time at n=64; 194 needed for 90 %"
    )
    assert judge_window(64, 2, 0.001).passed is False


def test_seeded_windows_at_the_slo_pass_and_a_2_percent_defect_is_caught() -> None:
    """Over 2000 seeded 194-request windows (a powered baseline), a service at exactly 99.9 %
    passes at least 95 in every 100 and a 2 % defect is caught about 90 in every 100: each rate
    agrees with its exact figure (1.6 % false alarms, 90.2 % caught) within 4 standard errors.
    (At a power of exactly 90 %, "at least 90 of one given 100" is itself a coin flip.)"""
    rng = random.Random(21)
    n = required_requests(0.001)
    assert n == 194

    def fails(p: float) -> bool:
        return not judge_window(n, sum(rng.random() < p for _ in range(n)), 0.001).passed

    healthy = [fails(0.001) for _ in range(2000)]
    defect = [fails(0.02) for _ in range(2000)]
    assert sum(healthy) <= 0.05 * len(healthy) and sum(defect) >= 0.88 * len(defect)
    exact = judge_window(n, 0, 0.001)
    assert exact.false_alarm == pytest.approx(0.0163, abs=5e-4)
    assert exact.power == pytest.approx(0.9016, abs=5e-4)
    for seen, p in ((healthy, exact.false_alarm), (defect, exact.power)):
        sigma = math.sqrt(p * (1 - p) / len(seen))
        assert abs(sum(seen) / len(seen) - p) < 4 * sigma, (sum(seen), p)


def test_the_plan_settings_are_checked_with_one_line() -> None:
    assert plan_settings({}) == {"false_alarm": 0.05, "power": 0.9, "defect": 0.02}
    got = plan_settings({"window_false_alarm": "0.01", "window_power": "${window_power}"})
    assert got == {"false_alarm": 0.01, "power": 0.9, "defect": 0.02}
    for bad, msg in (("2", "strictly between 0 and 1"), ("x", "not a number"), ("0", "strictly")):
        with pytest.raises(ValueError, match=msg) as err:
            plan_settings({"window_false_alarm": bad})
        assert "\n" not in str(err.value)


# -- the probe and the verdict -----------------------------------------------------------------


def _run(path: Path, records: list[dict[str, Any]], **conf: Any) -> dict[str, Any]:
    path.mkdir(parents=True, exist_ok=True)
    return {**write_run(path, records), **conf}


def _window(t0: float, n: int, bad: int, **fail: Any) -> list[dict[str, Any]]:
    """``n`` requests 0.1 s apart from ``t0``, the first ``bad`` with ``fail``."""
    return [
        attempt(f"w{i}", t0 + 0.1 * i, **(fail if i < bad else {})) for i in range(n)
    ]  # fmt: skip


def test_the_probe_passes_one_failure_in_200_fails_five_and_states_its_rates(
    tmp_path: Path,
) -> None:
    t0 = time.time() - 25.0
    one = slo_check("availability", 30, _run(tmp_path / "one", _window(t0, 200, 1, ok=False)))
    assert (one["passed"], one["value"], one["requests"]) == (True, 0.995, 200)
    assert one["test"]["fails_at"] == 2 and one["test"]["bad"] == 1 and one["test"]["powered"]
    assert one["test_settings"] == {"false_alarm": 0.05, "power": 0.9, "defect": 0.02}
    conf = _run(tmp_path / "five", _window(t0, 200, 5, ok=False))
    five = slo_check("availability", 30, conf)
    assert five["passed"] is False
    assert five["statement"].startswith("5 failed of 200: fails at 2 or more failed of 200")
    line = hypothesis_failures(
        {"steady_states": {"before": {"probes": [
            {"activity": {"name": "availability-meets-slo"}, "output": five, "tolerance_met": False}
        ]}}}
    )  # fmt: skip
    assert line == [
        (
            "before",
            "availability-meets-slo: availability = 0.975 (>= 0.999 required, 200 logical "
            "requests; attempts: 0.975 over 200): 5 failed of 200: fails at 2 or more failed of "
            "200 (false alarm 1.7 % at the SLO, bound 5 %); catches a 2 % defect 91 % of the "
            "time at n=200",
        )
    ]
    # the plan's bound is the probe's: two failures in 200 fail at 5 %, pass at 0.1 % (k = 4)
    two = _run(tmp_path / "two", _window(t0, 200, 2, ok=False))
    assert slo_check("availability", 30, two)["passed"] is False
    strict = slo_check("availability", 30, {**two, "window_false_alarm": 0.001})
    assert strict["passed"] is True and strict["test"]["fails_at"] == 4
    # one failure never fails a window whose SLO allows some, whatever the bound
    loose = {
        **_run(tmp_path / "loose", _window(t0, 200, 1, ok=False)),
        "window_false_alarm": 0.2,
    }
    assert slo_check("availability", 30, loose)["passed"] is True


def test_the_p99_probe_counts_the_requests_over_its_threshold(tmp_path: Path) -> None:
    t0 = time.time() - 25.0
    # 200 successful requests; P[X >= 6 | 200, 1 %] = 1.7 % <= 5 % < P[X >= 5] = 5.3 %
    five = slo_check("p99_e2e_s", 30, _run(tmp_path / "a", _window(t0, 200, 5, e2e=11.0)))
    six = slo_check("p99_e2e_s", 30, _run(tmp_path / "b", _window(t0, 200, 6, e2e=11.0)))
    assert five["value"] > 10.0  # the point estimate alone would fail it
    assert (five["passed"], six["passed"]) == (True, False)
    assert six["statement"].startswith("6 over 10 s of 200: fails at 6 or more over 10 s of 200")


def test_the_baseline_holds_one_failure_in_200_and_fails_on_five_with_its_rates() -> None:
    from test_verdict import GOOD, felt

    t0 = 1_700_000_000.0
    ground, fig = dict(GOOD["oom-kill"][0]), dict(GOOD["oom-kill"][1])
    ground.update(fault_at=t0 + 20.0, replica_serving_again_at=t0 + 22.0)
    for bad, state in ((1, "passed"), (5, "failed")):
        # 10 req/s: 200 sent before the fault, 1200 in the drill (one failure is not shown to break 99.9 %)
        records = steady(t0, t0 + 120)
        for r in records[:bad]:
            r.update(ok=False, error_class="http_5xx", first_token_at=None, chunk_times=[])
        records = felt("oom-kill", records, ground)
        v = judge_drill(DrillFacts("oom-kill", records, fig, ground))
        assert v.state == state, v.reasons
        tests = v.windows["baseline"]["slo_tests"]
        # 200 sent before the fault; the last two (0.3 s streams) were on the wire, healthy, at
        # the injection: the fault's ("Windows", across the injection)
        assert tests["availability"]["n"] == 198 and tests["availability"]["fails_at"] == 2
        # 198 >= 194: availability and error rate are powered, the timeout rate and P99 not
        (note,) = [n for n in v.notes if n.startswith("baseline:")]
        assert "availability:" not in note and "error rate:" not in note
        assert "timeout rate: fails at 4 or more timed out of 198" in note
        assert "525 needed for 90 %" in note and "P99: fails at" in note
    # by hand: 193 / 198 = 0.9747; P[X >= 2 | 198, 0.1 %] = 1.7 %; P[X >= 2 | 198, 2 %] = 90.8 %
    rates = (
        "5 failed of 198: fails at 2 or more failed of 198 (false alarm 1.7 % at the SLO, bound "
        "5 %); catches a 2 % defect 91 % of the time at n=198"
    )
    assert v.reasons == [
        "the service did not meet its SLOs before the fault (not blamed on the fault): "
        f"availability (baseline): 0.9747 < 0.999; {rates} (availability); "
        f"error rate (baseline): 0.02525 >= 0.001; {rates} (error_rate)"
    ]


def test_a_short_baseline_is_judged_and_the_verdict_notes_its_power() -> None:
    from test_verdict import GOOD, felt

    t0 = 1_700_000_000.0
    ground, fig = dict(GOOD["oom-kill"][0]), dict(GOOD["oom-kill"][1])
    ground.update(fault_at=t0 + 6.6, replica_serving_again_at=t0 + 8.0)
    records = steady(t0, t0 + 110)  # 64 requests before the fault, 1100 in the drill
    records[3].update(ok=False, error_class="http_5xx", first_token_at=None, chunk_times=[])
    records = felt("oom-kill", records, ground)
    v = judge_drill(DrillFacts("oom-kill", records, fig, ground))
    assert v.state == "passed", v.reasons  # one failure in 64 is within 99.9 % (k = 2)
    (note,) = [n for n in v.notes if n.startswith("baseline:")]
    assert note.startswith(
        "baseline: 64 requests: availability: fails at 2 or more failed of 64 (false alarm "
        "0.19 % at the SLO, bound 5 %); catches a 2 % defect only 37 % of the time at n=64; 194 "
        "needed for 90 % | timeout rate: fails at 2 or more timed out of 64"
    )  # power per judged figure: P99 over the 63 successful requests
    assert note.endswith(
        "P99: fails at 3 or more over 10 s of 63 (false alarm 2.5 % at the SLO, bound 5 %); "
        "catches a 2 % defect only 13 % of the time at n=63; 1349 needed for 90 %"
    )
    # the settings the probes ran with are the verdict's
    # a 10 % defect is caught 99 % of the time at n=64: no note
    looser = judge_drill(
        DrillFacts("oom-kill", records, fig, ground, window_settings={"defect": 0.1})
    )
    assert looser.state == "passed" and not any(n.startswith("baseline") for n in looser.notes)
    journal = {"steady_states": {"before": {"probes": [
        {"output": {"test_settings": {"false_alarm": 0.1, "power": 0.9, "defect": 0.02}}}
    ]}}}  # fmt: skip
    assert window_settings(journal) == {"false_alarm": 0.1, "power": 0.9, "defect": 0.02}


# -- sizing the shipped baseline ---------------------------------------------------------------


def test_warmup_auto_sizes_the_baseline_from_the_rate_and_the_plan() -> None:
    from chaoslib_infer.controls.load import baseline_need, warmup_seconds

    assert baseline_need({}) == 194 and baseline_need({"slo_availability": "0.99"}) == 1349
    assert warmup_seconds("auto", 8.0, {}) == 25.0  # 194 requests at 8 req/s
    assert warmup_seconds("auto", 16.0, {}) == 13.0
    assert warmup_seconds(" 8 ", 8.0, {}) == 8.0  # a number stays a number (an env value)
    # a looser SLO needs more to tell a 2 % defect from it: 1349 requests at 99 %
    assert warmup_seconds("auto", 8.0, {"slo_availability": "0.99"}) == math.ceil(1349 / 8)
    assert warmup_seconds("auto", 8.0, {"window_power": "0.5"}) < 25.0
    for bad, msg in (("soon", "give seconds or auto"), ("-1", "must be >= 0")):
        with pytest.raises(ValueError, match=msg):
            warmup_seconds(bad, 8.0, {})
    with pytest.raises(ValueError, match="window_defect"):
        warmup_seconds("auto", 8.0, {"window_defect": "2"})


def test_the_shipped_lab_experiments_warm_up_for_a_powered_baseline() -> None:
    """Every shipped experiment whose load runs at a fixed rate warms up ``auto`` by default:
    its baseline holds the 194 requests a 2 % defect needs at 99.9 %; the Kubernetes ones too."""
    import yaml

    from chaoslib_infer.controls.load import warmup_seconds

    root = Path(__file__).resolve().parents[1] / "experiments"
    sized = []
    for path in sorted([*root.glob("*.yaml"), *root.glob("k8s/*.yaml")]):
        exp = yaml.safe_load(path.read_text())
        conf = exp.get("configuration") or {}
        control = next(c for c in exp.get("controls") or [] if c["name"] == "background-load")
        args = control["provider"].get("arguments") or {}
        if conf.get("load_profile") or "profile" in args:  # traffic-spike: its first phase
            continue
        warm = conf["load_warmup_s"]
        warm = warm["default"] if isinstance(warm, dict) else warm
        # the load settings come from the configuration (load_<name>), none written out
        assert "warmup_s" not in args and "rate_rps" not in args, path
        rate = conf["load_rate_rps"]
        assert warmup_seconds(warm, float(rate), {}) * float(rate) >= 194, path
        sized.append(path.stem)
    assert len(sized) == 12, sized  # 6 lab + 6 Kubernetes experiments (traffic-spike: a profile)
