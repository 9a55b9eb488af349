"""Client retry policy, rate profiles, their CLI flags and the control's pass-through (fake server)."""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chaoslib.exceptions import InterruptExecution
from labutil import run_module

from chaoslib_infer.controls import load as load_control
from chaoslib_infer.load.client import (
    DEFAULT_RETRY_ON,
    LoadSpec,
    retry_backoff_delay,
    run_load_blocking,
)
from chaoslib_infer.load.fakeserver import FakeServer
from chaoslib_infer.load.records import OPTIONAL_FIELDS, RECORD_FIELDS, read_records
from chaoslib_infer.load.schedule import (
    check_profile,
    parse_profile,
    profile_phases,
    profile_schedule,
    truncate_profile,
)
from chaoslib_infer.measure.metrics import logical_stats, retry_stats, window_stats

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    with FakeServer(replica="rt") as srv:
        yield srv


def by_request(recs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        out.setdefault(r["request_id"], []).append(r)
    return {k: sorted(v, key=lambda r: r["attempt"]) for k, v in out.items()}


def request_index(request_id: str) -> int:
    return int(request_id.rsplit("-", 1)[1], 16)


def arrivals_of(srv: FakeServer, rids: set[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for rid, _ in srv.arrivals:
        if rid in rids:
            out[rid] = out.get(rid, 0) + 1
    return out


# --- retry policy against the fake server ------------------------------------------------------


def test_retry_until_success_records_and_backoff(server: FakeServer, tmp_path: Path) -> None:
    spec = LoadSpec(
        url=server.url + "/mode=http,status=503,fail=2",
        rate_rps=5,
        duration_s=1.0,
        arrival="constant",
        retry_attempts=3,
        retry_backoff_s=0.2,
        seed=11,
    )
    summary = run_load_blocking(spec, tmp_path / "r.jsonl")
    recs = read_records(tmp_path / "r.jsonl")
    groups = by_request(recs)
    assert len(groups) == 5 and len(recs) == 15
    for rid, atts in groups.items():
        assert [[k for k in r if k not in OPTIONAL_FIELDS] for r in atts] == [
            list(RECORD_FIELDS)
        ] * 3
        assert [r["attempt"] for r in atts] == [1, 2, 3]
        assert [r["final"] for r in atts] == [False, False, True]
        assert [r["error_class"] for r in atts] == ["http_5xx", "http_5xx", None]
        assert atts[2]["ok"] and atts[2]["replica"] == "rt"
        # the jitter is drawn from random.Random(f"{seed}:retry:{index}"): exact expected delays
        rng = random.Random(f"11:retry:{request_index(rid)}")
        for n in (1, 2):
            delay = retry_backoff_delay(spec, n, rng)
            base = 0.2 * 2 ** (n - 1)
            assert 0.8 * base <= delay <= 1.2 * base
            prev, nxt = atts[n - 1], atts[n]
            # retry intended at the end of its backoff, sent right then
            assert delay <= nxt["intended_at"] - prev["end_at"] <= delay + 0.02
            assert 0 <= nxt["sent_at"] - nxt["intended_at"] < 0.02
    # the server saw exactly three requests per id: no hidden transport retry
    assert set(arrivals_of(server, set(groups)).values()) == {3}
    assert retry_stats(recs) == {
        "logical_requests": 5,
        "attempts": 15,
        "retries": 10,
        "retried_requests": 5,
        "succeeded_after_retry": 5,
    }
    assert window_stats(recs)["availability"] == pytest.approx(5 / 15)
    ls = logical_stats(recs)
    assert ls["requests"] == 5 and ls["availability"] == 1.0
    assert ls["attempts"] == 15 and ls["retries"] == 10
    # logical E2E includes both backoffs (>= 0.16 + 0.32 s)
    assert ls["p50_e2e_s"] >= 0.48
    for key, want in (
        ("sent", 5),
        ("attempts", 15),
        ("retries", 10),
        ("retried_requests", 5),
        ("succeeded_after_retry", 5),
        ("ok", 5),
        ("failed", 10),
        ("logical_ok", 5),
        ("logical_failed", 0),
    ):
        assert summary[key] == want, key
    assert summary["retry"] == {
        "attempts": 3,
        "backoff_s": 0.2,
        "attempt_timeout_s": 30.0,
        "retry_on": list(DEFAULT_RETRY_ON),
    }


def test_no_retry_on_success(server: FakeServer, tmp_path: Path) -> None:
    spec = LoadSpec(
        url=server.url + "/mode=ok,tokens=4", rate_rps=20, duration_s=0.5, retry_attempts=4
    )
    summary = run_load_blocking(spec, tmp_path / "r.jsonl")
    recs = read_records(tmp_path / "r.jsonl")
    assert len(recs) == summary["sent"] == summary["attempts"] > 3
    assert all(r["ok"] and r["attempt"] == 1 and r["final"] is True for r in recs)
    assert len({r["request_id"] for r in recs}) == len(recs)
    assert set(arrivals_of(server, {r["request_id"] for r in recs}).values()) == {1}
    assert summary["retries"] == 0 and retry_stats(recs)["retries"] == 0


def test_exhausted_retries_and_classes_not_retried(server: FakeServer, tmp_path: Path) -> None:
    # always 503: two attempts, both failed, the second final
    spec = LoadSpec(
        url=server.url + "/mode=http,status=503",
        rate_rps=4,
        duration_s=0.5,
        arrival="constant",
        retry_attempts=2,
        retry_backoff_s=0.05,
    )
    run_load_blocking(spec, tmp_path / "a.jsonl")
    recs = read_records(tmp_path / "a.jsonl")
    for atts in by_request(recs).values():
        assert [(r["attempt"], r["final"], r["ok"]) for r in atts] == [
            (1, False, False),
            (2, True, False),
        ]
    st = retry_stats(recs)
    assert st["retried_requests"] == st["logical_requests"] == 2
    assert st["succeeded_after_retry"] == 0
    assert logical_stats(recs)["availability"] == 0.0
    # 4xx is not in the default retry_on; a reset is not retried when retry_on excludes it
    for prefix, retry_on in (
        ("mode=http,status=400", DEFAULT_RETRY_ON),
        ("mode=drop", ("http_5xx",)),
    ):
        spec = LoadSpec(
            url=f"{server.url}/{prefix}",
            rate_rps=4,
            duration_s=0.5,
            arrival="constant",
            retry_attempts=3,
            retry_backoff_s=0.05,
            retry_on=retry_on,
        )
        run_load_blocking(spec, tmp_path / "b.jsonl")
        recs = read_records(tmp_path / "b.jsonl")
        assert len(recs) == 2
        assert all(r["attempt"] == 1 and r["final"] and not r["ok"] for r in recs)
        assert set(arrivals_of(server, {r["request_id"] for r in recs}).values()) == {1}


def test_attempt_timeout_then_retry(server: FakeServer, tmp_path: Path) -> None:
    # first attempt stalls before any output: timeout_total at attempt_timeout_s, then success
    spec = LoadSpec(
        url=server.url + "/mode=stall,k=0,fail=1",
        rate_rps=2,
        duration_s=0.5,
        arrival="constant",
        timeout_s=20.0,
        ttft_timeout_s=None,
        attempt_timeout_s=0.4,
        retry_attempts=2,
        retry_backoff_s=0.1,
    )
    t0 = time.monotonic()
    run_load_blocking(spec, tmp_path / "r.jsonl")
    assert time.monotonic() - t0 < 5
    (atts,) = by_request(read_records(tmp_path / "r.jsonl")).values()
    first, second = atts
    assert first["error_class"] == "timeout_total" and first["final"] is False
    assert first["end_at"] - first["sent_at"] == pytest.approx(0.4, abs=0.05)
    assert second["ok"] and second["final"] is True and second["attempt"] == 2
    assert 0.08 <= second["sent_at"] - first["end_at"] <= 0.14


# --- measurement on hand-made records ----------------------------------------------------------


def rec(rid: str, attempt: int, final: bool | None, ok: bool, sent: float, end: float) -> dict:
    r: dict[str, Any] = {
        "request_id": rid,
        "attempt": attempt,
        "intended_at": sent,
        "sent_at": sent,
        "ok": ok,
        "error_class": None if ok else "http_5xx",
        "error": None if ok else "HTTP 503",
        "first_token_at": sent + 0.01 if ok else None,
        "chunk_times": [],
        "end_at": end,
        "output_tokens": 1,
    }
    if final is not None:
        r["final"] = final
    return r


HAND = [
    rec("a", 1, True, True, 100.0, 100.5),  # ok first time
    rec("b", 1, False, False, 100.2, 100.3),  # fails, then ok on attempt 2
    rec("b", 2, True, True, 100.6, 101.0),
    rec("c", 1, False, False, 101.0, 101.1),  # fails three times
    rec("c", 2, False, False, 101.3, 101.4),
    rec("c", 3, True, False, 101.8, 101.9),
    rec("d", 1, False, False, 102.5, 102.6),  # stopped during the backoff: no final record
    rec("e", 2, True, True, 103.1, 103.2),  # out of order in the file
    rec("e", 1, False, False, 102.9, 103.0),
    rec("f", 1, None, True, 104.0, 104.1),  # an old record without "final"
]


def test_retry_stats_exact() -> None:
    assert retry_stats(HAND) == {
        "logical_requests": 6,
        "attempts": 10,
        "retries": 4,
        "retried_requests": 3,
        "succeeded_after_retry": 2,
    }
    assert retry_stats([]) == {
        "logical_requests": 0,
        "attempts": 0,
        "retries": 0,
        "retried_requests": 0,
        "succeeded_after_retry": 0,
    }


def test_logical_stats_exact() -> None:
    ls = logical_stats(HAND)
    assert (ls["requests"], ls["ok"], ls["failed"]) == (6, 4, 2)  # a b e f ok; c d failed
    assert ls["availability"] == pytest.approx(4 / 6)
    assert ls["attempts"] == 10 and ls["retries"] == 4
    assert ls["errors_by_class"] == {"http_5xx": {"count": 2, "sample": "HTTP 503"}}
    per_attempt = window_stats(HAND)
    assert (per_attempt["requests"], per_attempt["ok"]) == (10, 4)
    # windowed by the FIRST attempt's sent_at: b (first 100.2) is in [100, 100.5), its retry is not
    w = logical_stats(HAND, 100.0, 100.5)
    assert (w["requests"], w["ok"], w["attempts"]) == (2, 2, 3)
    # E2E from the first send: a 0.5 s, b 0.8 s
    assert w["p99_e2e_s"] == pytest.approx(0.8, rel=1e-3)
    assert window_stats(HAND, 100.5, 101.0)["requests"] == 1  # b's retry, per attempt
    assert logical_stats(HAND, 100.5, 101.0)["requests"] == 0


# --- rate profiles ------------------------------------------------------------------------------


def test_profile_schedule_rates_per_phase() -> None:
    profile = [(40.0, 50.0), (30.0, 300.0), (40.0, 50.0)]
    offs = profile_schedule(profile, seed=3)
    assert offs == sorted(offs) and 0 < offs[0] and offs[-1] < 110.0
    assert offs == profile_schedule(profile, seed=3)
    assert offs != profile_schedule(profile, seed=4)
    for ph in profile_phases(profile):
        lo, hi, rate = ph["start_s"], ph["end_s"], ph["rate_rps"]
        inside = [o for o in offs if lo <= o < hi]
        expected = rate * (hi - lo)
        # Poisson count: sd = sqrt(expected); 5 sd tolerance
        assert abs(len(inside) - expected) < 5 * expected**0.5, ph
        gaps = [b - a for a, b in zip(inside, inside[1:], strict=False)]
        mean = statistics.fmean(gaps)
        assert mean == pytest.approx(1 / rate, rel=0.1)
        assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, abs=0.1)  # exponential
    const = profile_schedule([(1.0, 4.0), (1.0, 8.0)], arrival="constant")
    assert const == pytest.approx([0, 0.25, 0.5, 0.75] + [1 + i / 8 for i in range(8)])


def test_profile_parse_truncate_and_spec() -> None:
    assert parse_profile("10:8, 15:24,15:8") == [(10.0, 8.0), (15.0, 24.0), (15.0, 8.0)]
    assert truncate_profile([(10, 8), (15, 24), (15, 8)], 20) == [(10.0, 8.0), (10.0, 24.0)]
    assert truncate_profile([(10, 8)], 30) == [(10.0, 8.0)]
    for bad in ("", "10", "10:8,15", "10:x", "0:5", "5:-1", "5:8:1", "nan:3", "inf:3"):
        with pytest.raises(ValueError):
            parse_profile(bad)
    for bad_p in ([], [(1, 2, 3)], "1:2", [(True, 1)], [[1, None]]):
        with pytest.raises(ValueError):
            check_profile(bad_p)
    spec = LoadSpec(url="http://127.0.0.1:1", profile=[[10, 8], [15, 24], [15, 8]])  # type: ignore[list-item]
    assert spec.duration_s == 40.0 and spec.rate_rps == pytest.approx((80 + 360 + 120) / 40)
    assert spec.profile == [(10.0, 8.0), (15.0, 24.0), (15.0, 8.0)]
    assert spec.offsets() == profile_schedule(spec.profile, 0)


@pytest.mark.parametrize(
    "kw",
    [
        {"retry_attempts": 0},
        {"retry_attempts": 1.5},
        {"retry_attempts": True},
        {"retry_backoff_s": -0.1},
        {"retry_backoff_s": float("nan")},
        {"attempt_timeout_s": 0},
        {"retry_on": ("bogus",)},
        {"retry_on": "http_5xx"},
        {"profile": [(0, 5)]},
    ],
)
def test_spec_rejects_bad_retry_and_profile(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        LoadSpec(url="http://127.0.0.1:1", **kw)


def test_profile_run_reports_phases(server: FakeServer, tmp_path: Path) -> None:
    spec = LoadSpec(url=server.url + "/mode=ok,tokens=2", profile=[(1.0, 10.0), (1.0, 40.0)])
    summary = run_load_blocking(spec, tmp_path / "r.jsonl")
    recs = read_records(tmp_path / "r.jsonl")
    p0, p1 = summary["phases"]
    assert (p0["rate_rps"], p1["rate_rps"]) == (10.0, 40.0)
    assert p0["start_at"] == summary["started_at"] and p1["start_at"] == p0["end_at"]
    assert p1["end_at"] == pytest.approx(summary["started_at"] + 2.0)
    assert p0["sent"] + p1["sent"] == summary["sent"] == len(recs) == summary["scheduled"]
    in1 = [r for r in recs if p0["start_at"] <= r["intended_at"] < p0["end_at"]]
    assert len(in1) == p0["sent"] == p0["scheduled"]
    assert p1["sent"] > p0["sent"]


# --- CLI ----------------------------------------------------------------------------------------


def cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return run_module("chaoslib_infer.load", *args, timeout=timeout)


@pytest.mark.parametrize(
    "extra",
    [
        ["--rate", "5", "--duration-s", "1", "--retry-attempts", "0"],
        ["--rate", "5", "--duration-s", "1", "--retry-attempts", "x"],
        ["--rate", "5", "--duration-s", "1", "--retry-backoff-s", "-1"],
        ["--rate", "5", "--duration-s", "1", "--attempt-timeout-s", "0"],
        ["--rate", "5", "--duration-s", "1", "--retry-on", "http_5xx,bogus"],
        ["--profile", "10:8,15"],
        ["--profile", "10:x"],
        ["--profile", "0:8"],
        ["--profile", ""],
        ["--profile", "10:8", "--duration-s", "-1"],
        ["--duration-s", "1"],
        ["--rate", "5"],
    ],
)
def test_cli_rejects_bad_flags(extra: list[str], tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    proc = cli("--url", "http://127.0.0.1:1", "--out", str(out), *extra)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m chaoslib_infer.load: error:"), lines
    assert not out.exists()


def test_cli_retry_and_profile(server: FakeServer, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    proc = cli(
        "--url",
        server.url + "/mode=http,status=429,fail=1",
        "--out",
        str(out),
        "--profile",
        "0.5:10,0.5:30,5:10",
        "--duration-s",
        "1.0",
        "--retry-attempts",
        "2",
        "--retry-backoff-s",
        "0.05",
        "--attempt-timeout-s",
        "2",
        "--retry-on",
        "http_429,reset",
        "--seed",
        "2",
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    recs = read_records(out)
    assert [(p["duration_s"], p["rate_rps"]) for p in summary["phases"]] == [(0.5, 10), (0.5, 30)]
    assert summary["retry"] == {
        "attempts": 2,
        "backoff_s": 0.05,
        "attempt_timeout_s": 2.0,
        "retry_on": ["http_429", "reset"],
    }
    n = summary["sent"]
    assert n == summary["scheduled"] > 5
    assert len(recs) == summary["records"] == summary["attempts"] == 2 * n
    assert retry_stats(recs) == {
        "logical_requests": n,
        "attempts": 2 * n,
        "retries": n,
        "retried_requests": n,
        "succeeded_after_retry": n,
    }
    assert {(r["attempt"], r["final"], r["error_class"]) for r in recs} == {
        (1, False, "http_429"),
        (2, True, None),
    }


# --- the control --------------------------------------------------------------------------------


def test_control_passes_retry_and_profile(
    server: FakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = {
        "infer_base_url": server.url + "/mode=http,status=503,fail=1",
        "infer_run_dir": str(tmp_path),
    }
    with pytest.raises(InterruptExecution, match="profile phase 2"):
        load_control.start_load(profile=[[1, 5], [1, 0]], configuration=conf)
    with pytest.raises(InterruptExecution, match="retry_attempts"):
        load_control.start_load(retry_attempts=0, configuration=conf)
    assert not (tmp_path / "load.pid").exists()
    started: list[list[str]] = []
    real_popen = subprocess.Popen

    def recording_popen(cmd: list[str], *a: Any, **kw: Any) -> subprocess.Popen[bytes]:
        started.append([str(c) for c in cmd])
        return real_popen(cmd, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    load_control.before_experiment_control(
        {},
        configuration=conf,
        warmup_s=0.8,
        max_duration_s=1.5,
        seed=1,
        retry_attempts=2,
        retry_backoff_s=0.05,
        attempt_timeout_s=3.0,
        profile=[[1.0, 10.0], [10.0, 30.0]],
        baseline_requests=1,  # one success is enough here (the load lasts 1.5 s)
    )
    monkeypatch.undo()
    pid = int((tmp_path / "load.pid").read_text())
    (args,) = started
    for flag, value in (
        ("--retry-attempts", "2"),
        ("--retry-backoff-s", "0.05"),
        ("--attempt-timeout-s", "3.0"),
        ("--profile", "1.0:10.0,10.0:30.0"),
        ("--duration-s", "1.5"),
    ):
        assert args[args.index(flag) + 1] == value
    proc = load_control._RUNNING[str(tmp_path.resolve())]
    proc.wait(timeout=15)  # max_duration_s cuts the 11 s profile at 1.5 s
    assert load_control.stop_load(conf) == 0
    summary = json.loads((tmp_path / "load.log").read_text().strip().splitlines()[-1])
    assert [(p["duration_s"], p["rate_rps"]) for p in summary["phases"]] == [(1.0, 10), (0.5, 30)]
    recs = read_records(tmp_path / "records.jsonl")
    st = retry_stats(recs)
    assert st["logical_requests"] == summary["sent"] > 5
    assert st["succeeded_after_retry"] == st["retried_requests"] == st["logical_requests"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_warmup_waits_for_a_baseline_the_verdict_can_judge(
    server: FakeServer, tmp_path: Path
) -> None:
    """A load whose answers come late is given time to put 55 successes on record before the
    hypothesis (the verdict needs 50 in the baseline), bounded by the patience; a short warm-up
    the operator chose waits only for 80 % of what its own schedule sent."""
    conf = {"infer_base_url": server.url + "/delay=1.5", "infer_run_dir": str(tmp_path)}
    started = time.monotonic()
    load_control.start_load(  # 40 req/s for 2 s = 80 scheduled: wait for 55, late by 1.5 s each
        rate_rps=40.0, warmup_s=2.0, max_duration_s=20, seed=3, configuration=conf
    )
    waited = time.monotonic() - started
    try:
        ok = sum(r.get("ok") is True for r in read_records(tmp_path / "records.jsonl"))
        assert ok >= load_control.BASELINE_REQUESTS
        assert 2.0 < waited < 2.0 + load_control.BASELINE_PATIENCE_S + 2
    finally:
        load_control.stop_load(conf)
    short = tmp_path / "short"
    conf = {"infer_base_url": server.url, "infer_run_dir": str(short)}
    started = time.monotonic()
    load_control.start_load(
        rate_rps=10.0, warmup_s=1.0, max_duration_s=20, seed=4, configuration=conf
    )
    waited = time.monotonic() - started
    try:
        ok = sum(r.get("ok") is True for r in read_records(short / "records.jsonl"))
        assert 8 <= ok < load_control.BASELINE_REQUESTS  # 0.8 x 10 req/s x 1 s, not 55
        assert waited < 1.0 + load_control.BASELINE_PATIENCE_S
    finally:
        load_control.stop_load(conf)
