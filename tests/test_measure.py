"""Metrics, SLO evaluation and drill figures on hand-made records with known answers."""

from __future__ import annotations

import math
from typing import Any

import pytest

from chaoslib_infer.measure.figures import (
    duplicates,
    interruption,
    recovery,
    restart,
    restart_from_records,
    steady_ttft_p50,
    warmup,
)
from chaoslib_infer.measure.metrics import (
    per_replica_share,
    per_second_series,
    percentiles_s,
    window_stats,
)
from chaoslib_infer.measure.slo import Thresholds, evaluate

T0 = 1_700_000_000.0
HDR_REL = 1e-3  # 3 significant digits


def rec(
    sent: float,
    e2e: float = 0.1,
    ok: bool = True,
    cls: str | None = None,
    ttft: float | None = 0.05,
    chunks: list[float] | None = None,
    replica: str | None = "r0",
    rid: str | None = None,
    tokens: int | None = None,
) -> dict[str, Any]:
    ft = sent + ttft if (ok and ttft is not None) else None
    ct = [sent + c for c in chunks] if chunks is not None else ([ft] if ft is not None else [])
    return {
        "request_id": rid or f"q{sent:.4f}",
        "attempt": 1,
        "intended_at": sent,
        "sent_at": sent,
        "status": 200 if ok else 503,
        "ok": ok,
        "error_class": None if ok else (cls or "http_5xx"),
        "error": None if ok else f"{cls or 'http_5xx'} happened",
        "first_byte_at": sent + 0.01 if replica else None,
        "first_token_at": ft,
        "chunk_times": ct,
        "end_at": sent + e2e,
        "output_tokens": tokens if tokens is not None else len(ct),
        "tokens_source": "chunks",
        "replica": replica,
        "text_len": 3 * len(ct),
    }


# ---------------------------------------------------------------- metrics


def test_availability_997_of_1000() -> None:
    recs = [rec(T0 + i * 0.01) for i in range(997)]
    recs += [
        rec(T0 + 10.0, ok=False, cls="timeout_total"),
        rec(T0 + 10.1, ok=False, cls="http_5xx"),
        rec(T0 + 10.2, ok=False, cls="empty"),
    ]
    s = window_stats(recs)
    assert (s["requests"], s["ok"], s["failed"], s["timeouts"]) == (1000, 997, 3, 1)
    assert s["availability"] == pytest.approx(0.997)
    assert s["error_rate"] == pytest.approx(0.003)
    assert s["timeout_rate"] == pytest.approx(0.001)
    assert s["censored_fraction"] == pytest.approx(0.003)
    assert s["errors_by_class"] == {
        "timeout_total": {"count": 1, "sample": "timeout_total happened"},
        "http_5xx": {"count": 1, "sample": "http_5xx happened"},
        "empty": {"count": 1, "sample": "empty happened"},
    }


def test_percentiles_of_known_distribution() -> None:
    # e2e uniformly 1 ms .. 1000 ms; failures with huge latency must not enter the percentiles
    recs = [rec(T0 + i, e2e=(i + 1) / 1000) for i in range(1000)]
    recs += [rec(T0 + 2000 + i, e2e=60.0, ok=False, cls="timeout_total") for i in range(10)]
    s = window_stats(recs)
    assert s["p50_e2e_s"] == pytest.approx(0.500, rel=HDR_REL)
    assert s["p95_e2e_s"] == pytest.approx(0.950, rel=HDR_REL)
    assert s["p99_e2e_s"] == pytest.approx(0.990, rel=HDR_REL)
    assert s["p999_e2e_s"] == pytest.approx(0.999, rel=HDR_REL)
    assert s["censored_fraction"] == pytest.approx(10 / 1010)
    assert s["p50_ttft_s"] == pytest.approx(0.05, rel=HDR_REL)


def test_percentiles_helper() -> None:
    assert percentiles_s([], (50,)) == {50: None}
    assert percentiles_s([float("nan")], (50,)) == {50: None}
    got = percentiles_s([0.000001, 2.0, 3.0], (0, 100))
    assert got[0] == pytest.approx(1e-6) and got[100] == pytest.approx(3.0, rel=HDR_REL)


def test_itl_and_tpot_from_chunk_times() -> None:
    # chunks at 0.1, 0.12, 0.15, 0.19: gaps 0.02, 0.03, 0.04 ; tpot = 0.09 / 3
    recs = [rec(T0 + i, e2e=0.2, chunks=[0.1, 0.12, 0.15, 0.19], ttft=0.1) for i in range(11)]
    s = window_stats(recs)
    assert s["p50_itl_s"] == pytest.approx(0.03, rel=HDR_REL)
    assert s["p99_itl_s"] == pytest.approx(0.04, rel=HDR_REL)
    assert s["p50_tpot_s"] == pytest.approx(0.03, rel=HDR_REL)
    assert s["p50_ttft_s"] == pytest.approx(0.1, rel=HDR_REL)


def test_window_bounds_and_empty() -> None:
    recs = [rec(T0 + i) for i in range(10)]
    s = window_stats(recs, T0 + 2, T0 + 5)
    assert s["requests"] == 3 and s["ok_rps"] == pytest.approx(1.0)
    e = window_stats(recs, T0 + 100, T0 + 200)
    assert e["requests"] == 0
    for k, v in e.items():
        counts = ("requests", "ok", "failed", "timeouts", "not_sent", "client_lag_reads")
        if k not in (*counts, "errors_by_class", "start", "end"):
            assert v is None or k == "ok_rps" and v == 0.0, k
        assert not (isinstance(v, float) and math.isnan(v))
    all_failed = window_stats([rec(T0, ok=False)])
    assert all_failed["p50_e2e_s"] is None and all_failed["availability"] == 0.0


def test_per_second_series() -> None:
    recs = [rec(T0 + 0.1), rec(T0 + 0.5, e2e=0.3), rec(T0 + 2.2, ok=False)]
    rows = per_second_series(recs, T0, T0 + 4)
    assert [r["t"] for r in rows] == [T0, T0 + 1, T0 + 2, T0 + 3]
    assert [(r["requests"], r["ok"], r["failed"]) for r in rows] == [
        (2, 2, 0),
        (0, 0, 0),
        (1, 0, 1),
        (0, 0, 0),
    ]
    assert rows[0]["p99_e2e_s"] == pytest.approx(0.3, rel=HDR_REL)
    assert rows[1]["p50_e2e_s"] is None and rows[2]["p50_e2e_s"] is None
    assert per_second_series([]) == []


def test_per_replica_share() -> None:
    recs = [rec(T0 + i, replica="r0") for i in range(6)]
    recs += [rec(T0 + i, replica="r1") for i in range(2)]
    recs += [rec(T0 + 1, ok=False, cls="connect", replica=None)]
    assert per_replica_share(recs, None, None) == {"r0": 0.75, "r1": 0.25}
    assert per_replica_share(recs, T0 + 100, T0 + 101) == {}


# ---------------------------------------------------------------- slo


def test_slo_defaults_and_rows() -> None:
    recs = [rec(T0 + i * 0.01, e2e=0.5 + (i % 10) * 0.01) for i in range(2000)]
    rows = evaluate(window_stats(recs))
    assert [r["metric"] for r in rows] == [
        "p50_e2e_s",
        "p95_e2e_s",
        "p99_e2e_s",
        "timeout_rate",
        "error_rate",
        "availability",
    ]
    assert all(r["passed"] for r in rows), rows
    p95 = rows[1]
    assert p95["threshold"] == pytest.approx(3 * rows[0]["value"])
    assert {r["op"] for r in rows} == {"<=", "<", ">="}


def test_slo_failures_and_overrides() -> None:
    recs = [rec(T0 + i * 0.01, e2e=3.0) for i in range(995)]
    recs += [rec(T0 + 20 + i, ok=False, cls="timeout_ttft") for i in range(5)]
    s = window_stats(recs)
    by = {r["metric"]: r for r in evaluate(s)}
    assert not by["p50_e2e_s"]["passed"] and by["p99_e2e_s"]["passed"]
    assert not by["timeout_rate"]["passed"]  # 0.005 is not < 0.005
    assert not by["error_rate"]["passed"] and not by["availability"]["passed"]
    by = {
        r["metric"]: r
        for r in evaluate(s, Thresholds(p50_e2e_s=5.0, timeout_rate=0.01, error_rate=None))
    }
    assert by["p50_e2e_s"]["passed"] and by["timeout_rate"]["passed"] and "error_rate" not in by


def test_slo_no_data_fails() -> None:
    rows = evaluate(window_stats([]))
    assert rows and all(not r["passed"] and r["value"] is None for r in rows)
    assert rows[1]["threshold"] is None


# ---------------------------------------------------------------- figures


def steady(start: float, end: float, rate: float = 10.0, **kw: Any) -> list[dict[str, Any]]:
    n = int(round((end - start) * rate))
    return [rec(start + i / rate, **kw) for i in range(n)]


def test_interruption_known_burst() -> None:
    fault = T0 + 10.0
    recs = steady(T0, T0 + 30)  # e2e 0.1 s
    # a failure before the fault is ignored
    recs[5] = rec(recs[5]["sent_at"], ok=False, cls="http_5xx")
    # burst: every request sent in [10.5, 12.5) fails
    recs = [
        rec(r["sent_at"], ok=False, cls="reset") if fault + 0.5 <= r["sent_at"] < fault + 2.5 else r
        for r in recs
    ]
    # a lone failure 10 s later (after a settled window) is a second episode, of 0 s
    recs.append(rec(fault + 12.05, ok=False, cls="http_5xx"))
    got = interruption(recs, fault, settle_s=5.0)
    assert got["first_failure_at"] == pytest.approx(fault + 0.6)
    assert got["last_failure_at"] == pytest.approx(fault + 12.15)
    assert got["interruption_s"] == pytest.approx(1.9)  # 1.9 s + 0 s out of SLO
    assert got["failed_requests"] == 21 and got["sustained"] is True
    assert (got["episodes"], got["longest_episode_s"]) == (2, pytest.approx(1.9))
    assert got["episode_spans"] == [
        [pytest.approx(0.6), pytest.approx(2.5)],
        [pytest.approx(12.15), pytest.approx(12.15)],
    ]


def test_interruption_intermittent_failures_extend_it() -> None:
    fault = T0 + 10.0
    recs = steady(T0, T0 + 40)
    # failures every 3 s from 11 to 20 (gaps < settle_s) keep the interruption open
    fails = {round(fault + 1 + 3 * k, 1) for k in range(4)}
    recs = [rec(r["sent_at"], ok=False) if round(r["sent_at"], 1) in fails else r for r in recs]
    got = interruption(recs, fault, settle_s=5.0)
    assert got["interruption_s"] == pytest.approx(9.0)
    assert got["failed_requests"] == 4


def test_interruption_none_and_unsettled() -> None:
    recs = steady(T0, T0 + 10)
    assert interruption(recs, T0 + 5) == {
        "interruption_s": 0.0,
        "failed_requests": 0,
        "first_failure_at": None,
        "last_failure_at": None,
        "sustained": True,
        "episodes": 0,
        "longest_episode_s": 0.0,
        "episode_spans": [],
    }
    # failures until the data ends: not sustained, last failure is the last one seen
    recs = steady(T0, T0 + 5) + [rec(T0 + 5 + i * 0.1, ok=False) for i in range(10)]
    got = interruption(recs, T0 + 4)
    assert got["sustained"] is False and got["failed_requests"] == 10
    assert got["interruption_s"] == pytest.approx(0.9)


def test_restart_and_warmup() -> None:
    died = T0 + 10.0
    recs = steady(T0, T0 + 10, replica="r1") + steady(T0, T0 + 30, rate=5, replica="r0")
    # r1 comes back: first served request sent at 13.0 (first byte 13.01), slow TTFTs first
    back = [rec(T0 + 13 + i * 0.2, replica="r1", ttft=t) for i, t in enumerate([0.9, 0.6, 0.3])]
    back += [rec(T0 + 14 + i * 0.1, replica="r1", ttft=0.05) for i in range(20)]
    back.append(rec(T0 + 12.5, replica="r1", ok=False, cls="http_5xx"))
    recs += back
    assert restart_from_records(recs, "r1", died) == pytest.approx(3.0)
    # the name contracts.md section 4 documents gives the same answer: first served 13.0 - 10.0
    assert restart(recs, "r1", died) == pytest.approx(3.0)
    assert restart_from_records(recs, "r9", died) is None
    p50 = steady_ttft_p50(recs, T0, died)
    assert p50 == pytest.approx(0.05, rel=HDR_REL)
    w = warmup(recs, "r1", died, k=3, steady_p50_ttft_s=p50)
    assert w["n"] == 3 and w["ttfts_s"] == pytest.approx([0.9, 0.6, 0.3])
    assert w["mean_ttft_s"] == pytest.approx(0.6) and w["max_ttft_s"] == pytest.approx(0.9)
    assert w["ratio_to_steady"] == pytest.approx(12.0, rel=2e-3)
    assert warmup(recs, "r9", died)["n"] == 0
    with pytest.raises(ValueError):
        warmup(recs, "r1", died, k=0)


def test_duplicates() -> None:
    recs = [rec(T0 + i, rid=f"a{i}") for i in range(5)]
    # a retried attempt of a1 (same logical id) is still one logical request
    recs.append({**recs[1], "attempt": 2})
    ledger = [
        {"t": T0, "event": "generation", "replica": "r0", "request_id": "a0", "pid": 1},
        {"t": T0, "event": "generation", "replica": "r0", "request_id": "a1", "pid": 1},
        {"t": T0, "event": "generation", "replica": "r1", "request_id": "a1", "pid": 2},
        {"t": T0, "event": "generation", "replica": "r0", "request_id": "a2", "pid": 1},
        {"t": T0, "event": "generation", "replica": "r0", "request_id": "a2", "pid": 1},
        {"t": T0, "event": "generation", "replica": "r0", "request_id": "a2", "pid": 1},
        {"t": T0, "event": "generation", "replica": "r0", "request_id": "other", "pid": 1},
        {"t": T0, "event": "generation", "replica": "r0", "request_id": "other", "pid": 1},
    ]
    assert duplicates(recs, ledger) == 2
    assert duplicates(recs, []) == 0


def test_recovery_known_answer() -> None:
    fault = T0 + 20.0
    base_recs = steady(T0, fault, e2e=0.2)
    baseline = window_stats(base_recs)
    # after the fault: 4 s of failures, then 4 s of slow (1.0 s) successes, then normal
    after = []
    for r in steady(fault, fault + 30, e2e=0.2):
        dt = r["sent_at"] - fault
        if dt < 4:
            after.append(rec(r["sent_at"], ok=False, cls="reset"))
        elif dt < 8:
            after.append(rec(r["sent_at"], e2e=1.0))
        else:
            after.append(r)
    recs = base_recs + after
    assert recovery(recs, fault, baseline, window_s=2.0, settle_s=5.0) == pytest.approx(8.0)
    # no impact at all: 0.0
    assert recovery(base_recs + steady(fault, fault + 20, e2e=0.2), fault, baseline) == 0.0
    # never recovers within the data
    assert recovery(base_recs + after[:70], fault, baseline) is None
    with pytest.raises(ValueError):
        recovery(recs, fault, {"p99_e2e_s": None, "error_rate": 0.0})
