"""Certification's intervals respect bursts, its ranks are transitive (issue 29 item 9).

Synthetic series and scorecards, no engine: fast. The block length is checked against the
theoretical optimum of an AR(1) series (``b = (3/2 (G/g)^2)^(1/3) n^(1/3)``, ``G/g = 2 phi / (1 -
phi^2)``: Politis & White 2004 with the 2009 correction, circular blocks), the intervals
against the true failure rate of a bursty (two-state Markov) failure process.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
from test_certify_ranking import _records, _target

from chaoslib_infer.certify.ranking import compare, rank_targets
from chaoslib_infer.certify.report import console_table
from chaoslib_infer.certify.significance import block_length, interval


def _burst_and_spread(n: int = 1000, bad: int = 10) -> tuple[list[float], list[float]]:
    burst = [0.0] * n
    burst[n // 3 : n // 3 + bad] = [1.0] * bad
    spread = [0.0] * n
    for i in range(bad):
        spread[i * (n // bad) + 7] = 1.0
    return burst, spread


def test_a_burst_gets_a_wider_interval_than_the_same_failures_spread_out() -> None:
    """Was: 10 failures in a row and 10 spread over 1000 requests gave the same interval (the
    records resampled one by one). Now the burst is resampled whole: its interval is at least
    twice as wide, the spread one stays the record bootstrap's (blocks of 1); both seeded."""
    burst, spread = _burst_and_spread()
    cb, cs = interval(burst, "ratio"), interval(spread, "ratio")
    assert cb is not None and cs is not None
    assert cs.block == 1 and cb.block > 5
    assert cb.lo <= 0.01 <= cb.hi and cs.lo <= 0.01 <= cs.hi
    assert cb.hi - cb.lo >= 2 * (cs.hi - cs.lo), (cb, cs)
    assert interval(burst, "ratio") == cb  # seeded: the same records, the same interval
    assert cb.to_json()["block"] == cb.block and "block bootstrap" in cb.to_json()["method"]
    # the same holds for latency: a stretch of slow requests is one event, not many
    lat_b = [1.0] * 1000
    lat_b[300:330] = [9.0] * 30
    lat_s = [9.0 if i % 33 == 5 else 1.0 for i in range(1000)]
    pb, ps = interval(lat_b, "p99"), interval(lat_s, "p99")
    assert pb is not None and ps is not None and pb.block > ps.block


@pytest.mark.parametrize(("phi", "seed"), [(0.3, 4), (0.5, 1), (0.8, 3)])
def test_the_block_length_follows_the_dependence(phi: float, seed: int) -> None:
    """On AR(1) series of 20000 the rule finds the optimum within 20 %; white noise gets 1."""
    rng = np.random.default_rng(seed)
    n = 20_000
    e = rng.normal(size=n)
    y = np.zeros(n)
    for i in range(1, n):
        y[i] = phi * y[i - 1] + e[i]
    ratio = 2 * phi / (1 - phi**2)
    optimum = (1.5 * ratio**2) ** (1 / 3) * n ** (1 / 3)
    assert block_length(y) == pytest.approx(optimum, rel=0.2)
    assert block_length(rng.normal(size=5000)) == 1
    assert block_length([0.0] * 500) == 1 and block_length([1.0, 0.0, 1.0]) == 1


def test_block_intervals_cover_a_bursty_failure_rate_far_more_often() -> None:
    """Failures in bursts (a two-state Markov chain: 2 % of requests failed, bursts of 10 on
    average) over 60 seeded runs of 1000 requests: the block bootstrap's 95 % interval holds
    the true rate far more often than the record bootstrap's (the same values shuffled, which
    the record bootstrap could not tell from the original: blocks of 1)."""
    rng = np.random.default_rng(7)
    p_in, stay = 0.002, 0.9
    true = p_in / (p_in + 1 - stay)
    block_hits = record_hits = 0
    runs = 60
    for _ in range(runs):
        u = rng.random(1000)
        x, state = np.zeros(1000), False
        for i in range(1000):
            state = bool(u[i] < (stay if state else p_in))
            x[i] = state
        cb = interval(list(x), "ratio")
        cr = interval(list(rng.permutation(x)), "ratio")
        assert cb is not None and cr is not None
        block_hits += cb.lo <= true <= cb.hi
        record_hits += cr.lo <= true <= cr.hi
    assert block_hits / runs >= record_hits / runs + 0.2, (block_hits, record_hits)


def _error_row(t: dict[str, object]) -> dict[str, object]:
    card = t["scorecard"]
    assert isinstance(card, dict)
    return next(r for r in card["tiers"][0]["rows"] if r["metric"] == "error rate (steady state)")


def test_ties_do_not_chain_a_wholly_lower_interval_ranks_above(tmp_path: Path) -> None:
    """A [0.9, 1.1], B [1.05, 1.35], C [1.3, 1.5] on the steady error rate (lower is better):
    were all rank 1 (A~B, B~C chained). Now A ranks above C: A 1, B 1, C 2, and the notes say
    why, from each side."""
    recs = _records(random.Random(3), 300, 0.5, 0.2)
    targets = [_target(tmp_path, name, recs) for name in ("C", "B", "A")]  # input order: C first
    for t, (v, lo, hi) in zip(
        targets, [(1.4, 1.3, 1.5), (1.2, 1.05, 1.35), (1.0, 0.9, 1.1)], strict=True
    ):
        _error_row(t).update(value=v, ci={"lo": lo, "hi": hi, "n": 300, "stat": "ratio"})
    by = {t["name"]: t for t in targets}
    assert compare(by["A"], by["C"])[0] == -1
    assert compare(by["A"], by["B"])[0] == 0 == compare(by["B"], by["C"])[0]
    ranked = rank_targets(targets)
    assert [(t["name"], t["rank"]) for t in ranked] == [("A", 1), ("B", 1), ("C", 2)]
    assert by["A"]["better_than"] == ["C"] and by["A"]["tied_with"] == ["B"]
    assert by["C"]["tie"] is False and by["B"]["better_than"] == []
    assert any(n.startswith("above C on error rate (steady state) 1 [0.9, 1.1] vs 1.4")
               for n in by["A"]["ranking_note"])  # fmt: skip
    assert any(n.startswith("not told apart from B (rank 1)") for n in by["C"]["ranking_note"])
    head, ranks = console_table({"targets": ranked}).splitlines()[:2]
    assert head.split() == ["A", "B", "C"] and ranks.split() == [
        "rank",
        "1",
        "(tie)",
        "1",
        "(tie)",
        "2",
    ]


def test_a_clear_order_stays_a_clear_order(tmp_path: Path) -> None:
    """Three targets each wholly apart: ranks 1, 2, 3, no tie, whatever the input order."""
    recs = _records(random.Random(4), 300, 0.5, 0.2)
    targets = [_target(tmp_path, name, recs) for name in ("mid", "worst", "best")]
    for t, v in zip(targets, (2.0, 3.0, 1.0), strict=True):
        _error_row(t).update(value=v, ci={"lo": v - 0.1, "hi": v + 0.1, "n": 300, "stat": "ratio"})
    ranked = rank_targets(targets)
    assert [(t["name"], t["rank"], t["tie"]) for t in ranked] == [
        ("best", 1, False), ("mid", 2, False), ("worst", 3, False)
    ]  # fmt: skip
    assert math.isclose(len(ranked[0]["better_than"]), 2)
