"""The history comparison (issue 32): the t prediction test and Holm's correction, its
false-alarm rate and power checked by a seeded simulation, a settings change named (never a
regression), too few runs said, and the reason's form."""

from __future__ import annotations

import math
import random

import pytest

from chaoslib_infer.history.compare import ALPHA, Past, compare_drill
from chaoslib_infer.history.record import DrillRecord
from chaoslib_infer.history.stats import holm, prediction_p, t_cdf

SETTINGS = {
    "client": {"load": {"rate_rps": 8.0, "retry_attempts": 1}},
    "gateway": {"gateway_retry": True},
}


def drill(
    figures: dict[str, float], settings: dict | None = None, status: str = "passed"
) -> DrillRecord:
    return DrillRecord("oom-kill", status, [], dict(figures), settings or SETTINGS)


def series(values: list[dict[str, float]], settings: dict | None = None) -> list[Past]:
    return [
        Past(i + 1, f"2026-12-0{1 + i % 9}T00:00:00+00:00", "lab:sim:x3", drill(v, settings))
        for i, v in enumerate(values)
    ]


def test_t_cdf_matches_the_table() -> None:
    # Student t quantiles (any statistics table): t_0.975 with 2, 5, 30 degrees of freedom
    for t, dof in ((4.303, 2), (2.571, 5), (2.042, 30)):
        assert t_cdf(t, dof) == pytest.approx(0.975, abs=2e-4)
        assert t_cdf(-t, dof) == pytest.approx(0.025, abs=2e-4)
    assert t_cdf(0.0, 3) == pytest.approx(0.5)


def test_holm_steps_down() -> None:
    assert holm([0.01, 0.04, 0.03], 0.05) == [True, False, False]  # 0.03 > 0.05/2
    assert holm([0.001, 0.02, 0.9], 0.05) == [True, True, False]  # 0.02 <= 0.05/2
    assert holm([0.2, 0.3], 0.05) == [False, False]


def test_prediction_p_is_small_only_far_outside_the_history() -> None:
    hist = [1.0, 1.1, 0.9, 1.05, 0.95]
    assert prediction_p(1.02, hist) > 0.5
    assert prediction_p(2.0, hist) < 0.001
    assert prediction_p(1.0, [1.0, 1.0, 1.0], min_sd=0.05) == 1.0


FIGS = {"restart_s": 2.0, "interruption_s": 0.8, "failed_requests": 6.0, "budget_share": 0.01}


def _draw(rng: random.Random, cv: float, scale: dict[str, float] | None = None) -> dict[str, float]:
    sd = math.sqrt(math.log(1 + cv * cv))
    return {k: v * (scale or {}).get(k, 1.0) * math.exp(rng.gauss(0, sd)) for k, v in FIGS.items()}


@pytest.mark.parametrize("n_history", [3, 6])
def test_false_alarm_rate_of_unchanged_runs_is_at_most_alpha(n_history: int) -> None:
    """2000 seeded series of unchanged runs (four log-normal figures, 25 % run-to-run
    variation): a drill reads regressed or improved in at most ALPHA = 5 % of them (plus three
    binomial standard errors); the rate measured is in the docstring of compare.py's test."""
    rng = random.Random(32)
    trials, alarms = 2000, 0
    for _ in range(trials):
        past = series([_draw(rng, 0.25) for _ in range(n_history)])
        c = compare_drill(drill(_draw(rng, 0.25)), past)
        assert c.reading != "not compared"
        alarms += c.reading in ("regressed", "improved")
    rate = alarms / trials
    assert rate <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / trials), rate
    assert rate > 0.005, rate  # the test is not vacuous: it does fire at about its stated rate


def test_a_doubled_restart_is_flagged_on_restart_s_only() -> None:
    """Power: restart time x2.5 with 10 % run-to-run variation, six earlier runs: flagged
    regressed on restart_s in at least 95 % of 500 seeded series; the unchanged figures are
    flagged no more often than the false-alarm rate allows."""
    rng = random.Random(7)
    hits = others = 0
    for _ in range(500):
        past = series([_draw(rng, 0.10) for _ in range(6)])
        c = compare_drill(drill(_draw(rng, 0.10, {"restart_s": 2.5})), past)
        flagged = {f.figure for f in c.figures if f.reading != "within noise"}
        hits += "restart_s" in flagged and c.reading == "regressed"
        others += bool(flagged - {"restart_s"})
    assert hits >= 475, hits
    assert others <= 500 * ALPHA + 3 * math.sqrt(500 * ALPHA), others


def test_the_reason_names_figure_value_history_and_test() -> None:
    past = series([{"restart_s": v} for v in (1.9, 2.1, 2.3, 2.0, 2.2, 1.95)])
    c = compare_drill(drill({"restart_s": 4.1}), past)
    assert c.reading == "regressed"
    assert c.reasons[0].startswith(
        "restart_s 4.1 s vs 1.9-2.3 s over the last 6 runs (regressed: p="
    )
    assert "Holm over 1 figures" in c.reasons[0]
    assert c.runs == [1, 2, 3, 4, 5, 6]
    better = compare_drill(drill({"restart_s": 0.5}), past)
    assert better.reading == "improved" and "improved" in better.reasons[0]


def test_a_settings_change_is_named_and_never_a_regression() -> None:
    """The gateway stops retrying: failures jump, but the runs before ran under other settings:
    the comparison names the change and compares nothing."""
    past = series([{"failed_requests": 0.0, "restart_s": 2.0 + i / 10} for i in range(6)])
    no_retry = {**SETTINGS, "gateway": {"gateway_retry": False}}
    c = compare_drill(drill({"failed_requests": 40.0, "restart_s": 2.1}, no_retry), past)
    assert c.reading == "not compared"
    assert c.settings_changed == ["gateway.gateway_retry: true -> false"]
    assert c.changed_since == 6
    assert any(
        "settings changed since run #6 (gateway.gateway_retry: true -> false)" in r
        for r in c.reasons
    )
    assert not any(f.reading == "regressed" for f in c.figures)


def test_too_few_comparable_runs_are_said() -> None:
    c = compare_drill(drill({"restart_s": 9.0}), series([{"restart_s": 2.0}, {"restart_s": 2.1}]))
    assert c.reading == "not compared"
    assert c.reasons == ["2 comparable run(s) of oom-kill; 3 needed for a comparison"]
