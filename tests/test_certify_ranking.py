"""Certification ranks only what is significant (issue 21 item 6): bootstrap intervals, ties,
requests a decision needs. Synthetic records, no engine: fast."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from chaoslib_infer.certify import load_plan
from chaoslib_infer.certify.ranking import compare, rank_targets
from chaoslib_infer.certify.report import console_table, score_target
from chaoslib_infer.certify.significance import (
    RESAMPLES,
    Interval,
    e2e_values,
    interval,
    overlap,
    requests_needed,
)
from chaoslib_infer.load.records import RecordWriter
from chaoslib_infer.measure.metrics import window_stats


def _records(rng: random.Random, n: int, median_s: float, sigma: float) -> list[dict[str, Any]]:
    """``n`` successful requests one every 0.1 s, E2E lognormal around ``median_s``."""
    out = []
    for i in range(n):
        t = 1_000.0 + 0.1 * i
        e2e = median_s * math.exp(rng.gauss(0.0, sigma))
        out.append({"request_id": f"r{i}", "attempt": 1, "final": True, "intended_at": t,
                    "sent_at": t, "status": 200, "ok": True, "error_class": None, "error": None,
                    "first_byte_at": t + e2e / 4, "first_token_at": t + e2e / 4,
                    "chunk_times": [t + e2e / 4, t + e2e], "end_at": t + e2e,
                    "output_tokens": 2, "tokens_source": "usage", "replica": None,
                    "text_len": 8})  # fmt: skip
    return out


def _target(tmp: Path, name: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """A certified target with one steady phase (``single``) of ``records``, scored as
    ``certify`` scores it (``score_target``: rows and their intervals)."""
    tdir = tmp / name
    (tdir / "single").mkdir(parents=True)
    with RecordWriter(tdir / "single" / "records.jsonl") as w:
        for r in records:
            w.write(r)
    st = window_stats(records)
    st["failed"] = st["requests"] - st["ok"]
    ph = {"name": "single", "kind": "steady", "records": "single/records.jsonl",
          "started_at": 1_000.0, "ended_at": 1_000.0 + 0.1 * len(records), "stats": st,
          "figures": {"requests": st["requests"], "error_rate": st["error_rate"],
                      "availability": st["availability"], "p50_e2e_s": st["p50_e2e_s"],
                      "p99_e2e_s": st["p99_e2e_s"]},
          "held": None}  # fmt: skip
    result: dict[str, Any] = {"name": name, "phases": [ph], "target": {},
                              "probe": {"usable": True}, "verdict": "CERTIFIED"}  # fmt: skip
    result["scorecard"] = score_target(result, tdir, load_plan(quick=True))
    return result


def _p99_row(t: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in t["scorecard"]["tiers"][0]["rows"] if r["metric"] == "P99 E2E latency")


def test_two_samples_of_one_engine_tie_and_say_how_many_requests_decide(tmp_path: Path) -> None:
    """Two mimics of one engine, a handful of requests each: their P99s differ (0.4x s vs
    0.5x s, as in the issue), the intervals overlap, so they share rank 1; the note names the
    figure, both intervals and the requests per target a decision needs."""
    rng = random.Random(7)
    a = _target(tmp_path, "a", _records(rng, 12, 0.30, 0.2))
    b = _target(tmp_path, "b", _records(rng, 12, 0.30, 0.2))
    pa, pb = _p99_row(a), _p99_row(b)
    assert pa["value"] != pb["value"]  # the point figures alone would rank them 1 and 2
    for row in (pa, pb):
        assert row["ci"]["n"] == 12 and row["ci"]["resamples"] == RESAMPLES
        assert row["ci"]["lo"] <= row["value"] * 1.01 and row["ci"]["hi"] >= row["ci"]["lo"]
    order, why, ties = compare(a, b)
    assert order == 0 and why == ""
    ranked = rank_targets([a, b])
    assert [t["rank"] for t in ranked] == [1, 1]
    assert all(t["tie"] for t in ranked)
    assert ranked[0]["tied_with"] == [ranked[1]["name"]]
    note = ranked[0]["ranking_note"][0]
    assert "tie on P99 E2E latency" in note and "intervals overlap" in note
    need = int(note.split("needs about ")[1].split()[0])
    assert need >= 100  # a P99 needs 100 requests (below that it is the slowest one seen)
    table = console_table({"targets": ranked})
    assert "1 (tie)" in table and "tie on P99 E2E latency" in table


def test_clearly_different_engines_rank_on_the_deciding_figure(tmp_path: Path) -> None:
    """A target three times slower at the tail ranks second, on P99, intervals disjoint."""
    rng = random.Random(11)
    fast = _target(tmp_path, "fast", _records(rng, 40, 0.30, 0.1))
    slow = _target(tmp_path, "slow", _records(rng, 40, 0.90, 0.1))
    order, why, _ = compare(slow, fast)
    assert order == 1 and why.startswith("P99 E2E latency")
    ranked = rank_targets([slow, fast])  # input order must not matter
    assert [t["name"] for t in ranked] == ["fast", "slow"]
    assert [t["rank"] for t in ranked] == [1, 2] and not any(t["tie"] for t in ranked)
    _, why_fast, _ = compare(fast, slow)
    assert ranked[0]["ranking_note"] == [f"above slow on {why_fast}"]
    assert "P99 E2E latency 0.4" in why_fast and "vs 1." in why_fast  # both values, intervals
    assert not overlap(*(Interval(**{k: _p99_row(t)["ci"][k] for k in ("lo", "hi", "n", "stat")})
                         for t in ranked))  # fmt: skip


def test_exact_figures_still_decide_and_unmeasured_ranks_below(tmp_path: Path) -> None:
    """A tier-1 failure decides whatever the intervals; a figure nobody measured ranks below."""
    rng = random.Random(3)
    a = _target(tmp_path, "a", _records(rng, 12, 0.30, 0.2))
    b = _target(tmp_path, "b", _records(rng, 12, 0.30, 0.2))
    b["probe"]["usable"] = False
    assert compare(a, b)[:2] == (-1, "usable")
    b["probe"]["usable"] = True
    _p99_row(b)["value"] = None
    order, why, _ = compare(a, b)
    assert order == -1 and "unmeasured" in why


def test_requests_needed_follows_the_spread() -> None:
    """The estimate: half-widths shrink as 1/sqrt(n); equal figures need no count; and at the
    estimated count, fresh samples of the two distributions do separate (ground truth)."""
    a, b = Interval(0.0, 2.0, 100, "p50"), Interval(1.0, 3.0, 100, "p50")
    assert requests_needed(1.0, a, 2.0, b) == 400  # ((1*10 + 1*10) / 1)^2
    assert requests_needed(1.0, a, 3.0, b) == 101  # ((20) / 2)^2 = 100, at least n + 1
    assert requests_needed(1.0, a, 1.0, b) is None
    a99, b99 = Interval(0.0, 2.0, 10, "p99"), Interval(1.0, 3.0, 10, "p99")
    assert requests_needed(1.0, a99, 3.0, b99) == 100  # a P99 needs 100 requests to exist
    assert requests_needed(1.0, Interval(1, 1, 5, "p50"), 2.0, Interval(2, 2, 5, "p50")) is None
    rng = random.Random(5)
    xa = [rng.gauss(1.00, 0.2) for _ in range(30)]
    xb = [rng.gauss(1.08, 0.2) for _ in range(30)]
    ca, cb = interval(xa, "p50"), interval(xb, "p50")
    assert ca is not None and cb is not None and overlap(ca, cb)
    need = requests_needed(sorted(xa)[15], ca, sorted(xb)[15], cb)
    assert need is not None and 30 < need < 5_000
    n = 2 * need  # twice the estimate: the intervals of the true medians must separate
    ya = [rng.gauss(1.00, 0.2) for _ in range(n)]
    yb = [rng.gauss(1.08, 0.2) for _ in range(n)]
    fa, fb = interval(ya, "p50"), interval(yb, "p50")
    assert fa is not None and fb is not None and not overlap(fa, fb)


def test_intervals_cover_known_values_and_refuse_nonsense() -> None:
    """Ratio interval around a known error rate; qps by Little's law; empty -> None."""
    fails = ([1.0] + [0.0] * 19) * 10  # 5 %, spread out: no dependence, blocks of 1
    ci = interval(fails, "ratio")
    assert ci is not None and ci.block == 1
    assert ci is not None and ci.lo < 0.05 < ci.hi and ci.hi - ci.lo < 0.08
    assert interval([], "p99") is None
    oks, durs = [1.0] * 50, [0.5] * 50  # 4 workers, 0.5 s each: 8 req/s
    q = interval(oks, "qps", durations=durs, concurrency=4)
    assert q is not None and q.lo == pytest.approx(8.0) and q.hi == pytest.approx(8.0)
    with pytest.raises(ValueError):
        interval([1.0], "p42")
    with pytest.raises(ValueError):
        interval([1.0], "qps")
    rec = _records(random.Random(1), 3, 0.5, 0.0)
    rec[1]["ok"] = False
    assert e2e_values(rec) == pytest.approx([0.5, 0.5])
