"""Three-phase load test and a short soak, scaled down, against a sim engine (CLI subprocess)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaoslib_infer.load.ceiling import sim_engine
from chaoslib_infer.load.records import read_records
from chaoslib_infer.load.soak import arrival_gaps, parse_burstiness, parse_mix, stream_report
from chaoslib_infer.measure.metrics import window_stats

CLI = [sys.executable, "-m", "chaoslib_infer.cli"]


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    with sim_engine(zero_latency=False, itl_s=0.002, output_tokens=16) as url:
        yield url


def test_three_phase_cli(engine: str, tmp_path: Path) -> None:
    out = tmp_path / "tp"
    cmd = [*CLI, "load", "three-phase", "--target", engine, "--out", str(out), "--single-n", "40",
           "--ramp", "2,8", "--step-s", "2", "--burst-rps", "30", "--burst-s", "2",
           "--max-tokens", "8", "--client-ceiling", "0"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    rep = json.loads((out / "report.json").read_text())
    assert [s["step"] for s in rep["steps"]] == ["single", "ramp-2", "ramp-8", "burst"]
    single = read_records(out / "single.jsonl")
    assert len(single) == 40 and all(r["ok"] for r in single)
    # sequential: each request starts after the previous one ended
    assert all(b["sent_at"] >= a["end_at"] for a, b in zip(single, single[1:], strict=False))
    # the acceptance table is the slo evaluation of each step's own records
    for s in rep["steps"]:
        assert s["passed"] == all(r["passed"] for r in s["acceptance"])
        st = window_stats(read_records(s["records"]))
        assert st["requests"] == s["stats"]["requests"]
        assert st["p99_e2e_s"] == s["stats"]["p99_e2e_s"]
    assert rep["steps"][-1]["stats"]["requests"] > 30  # 30 req/s for 2 s, Poisson
    assert "single" in p.stdout and "PASS" in p.stdout
    # Locust-format CSV stats beside each step's records (load.locuststats)
    for s in rep["steps"]:
        agg = _aggregated(Path(str(s["records"]).removesuffix(".jsonl") + "_stats.csv"))
        assert int(agg["Request Count"]) == s["stats"]["requests"], s["step"]
    # server-side metrics scraped at least once per second beside the records
    for s in rep["steps"][1:]:
        assert s["server"]["samples"] >= 2 and s["server"]["max_gap_s"] < 1.0
        assert s["server"]["mean_ttft_s"] is not None


def test_p99_jump_flag() -> None:
    from chaoslib_infer.load.phases import flag_steps

    def step(kind: str, p99: float | None, ok_rps: float = 10.0) -> dict[str, object]:
        return {"kind": kind, "stats": {"p99_e2e_s": p99, "ok_rps": ok_rps}, "flags": []}

    steps = [step("single", 0.1), step("ramp", 0.9), step("ramp", None), step("ramp", 9.5, 60.0)]
    flag_steps(steps, 10.0, ceiling_rps=100.0)
    assert steps[1]["flags"] == []  # 9x: no flag
    assert steps[2]["flags"] == []  # no data
    # compared with the last step that had a P99 (0.9 s): 9.5 > 9.0
    assert [f.split(":")[0] for f in steps[3]["flags"]] == ["p99_jump", "client_bound"]


def test_soak_cli_short(engine: str, tmp_path: Path) -> None:
    out = tmp_path / "soak"
    cmd = [*CLI, "load", "soak", "--target", engine, "--out", str(out), "--duration", "4s",
           "--rate", "20", "--burstiness", "gamma:0.5", "--headroom", "1.5",
           "--max-tokens-scale", "0.125", "--client-ceiling", "0", "--strict"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["valid"] and rep["rate_rps"] == 30
    recs = read_records(out / "records.jsonl")
    assert 60 <= len(recs) <= 200  # 30 req/s x 4 s = 120 expected
    assert rep["stats"]["requests"] == len(recs)
    lags = sorted(r["sent_at"] - r["intended_at"] for r in recs)
    assert rep["lag_p99_s"] >= lags[int(0.98 * len(lags))] - 1e-3
    assert sum(rep["stats"]["mix"].values()) == len(recs)
    assert stream_report(out / "records.jsonl")["p99_e2e_s"] == rep["stats"]["p99_e2e_s"]
    # Locust-format CSV stats beside the records, as a drill's
    agg = _aggregated(out / "records_stats.csv")
    assert int(agg["Request Count"]) == len(recs) and agg["TTFT 50%"] != "N/A"
    assert (out / "records_stats_history.csv").is_file() and (
        out / "records_failures.csv"
    ).is_file()


def _aggregated(stats_csv: Path) -> dict[str, str]:
    with stats_csv.open(newline="") as fh:
        return next(r for r in csv.DictReader(fh) if r["Name"] == "Aggregated")


def test_soak_invalid_when_lag_too_high(engine: str, tmp_path: Path) -> None:
    out = tmp_path / "soak"
    # max concurrency 1 with long streams: arrivals queue at the cap, lag grows
    cmd = [*CLI, "load", "soak", "--target", engine, "--out", str(out), "--duration", "2s",
           "--rate", "50", "--max-concurrency", "1", "--lag-p99-max-ms", "5",
           "--client-ceiling", "0", "--strict", "--mix", "long:1", "--max-tokens-scale", "0.1"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["valid"] is False and rep["stats"] is None
    assert "schedule lag P99" in rep["invalid_reason"]


def test_mix_and_burstiness_parsing() -> None:
    assert parse_mix("short:70,mid:25,long:5") == [("short", 70.0), ("mid", 25.0), ("long", 5.0)]
    with pytest.raises(ValueError):
        parse_mix("huge:1")
    assert parse_burstiness("poisson") is None and parse_burstiness("gamma:0.25") == 0.25
    with pytest.raises(ValueError):
        parse_burstiness("gamma:0")
    for shape in (None, 0.25, 4.0):
        it = arrival_gaps(100.0, shape, 1)
        gaps = [next(it) for _ in range(20000)]
        mean = sum(gaps) / len(gaps)
        cv = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean
        assert mean == pytest.approx(0.01, rel=0.05)
        assert cv == pytest.approx(1.0 if shape is None else shape**-0.5, rel=0.1)
