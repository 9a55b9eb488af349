"""``benchmarks/client_ceiling.py``: the TTFT error against the engine's kernel-stamped truth, its
legs and the client lag, from records and a ``--ttft-log`` (issue 16); the h2load rate line."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

# timing-sensitive: scripts/quickstart test runs it alone, after the parallel pass
pytestmark = [pytest.mark.serial]


def _bench() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "client_ceiling.py"
    spec = importlib.util.spec_from_file_location("client_ceiling", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["client_ceiling"] = mod
    spec.loader.exec_module(mod)
    return mod


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_ttft_error_uses_the_kernel_truth_and_splits_the_legs(tmp_path: Path) -> None:
    cc = _bench()
    recs, log = [], []
    for i in range(10):
        sent = 100.0 + i
        rid = f"r{i}"
        # client: sent at `sent`, first token stamped 2 ms later; loop saw it 0.5 ms after that
        recs.append({
            "request_id": rid, "ok": True, "sent_at": sent, "first_token_at": sent + 0.002,
            "time_source": "kernel", "sent_source": "connect" if i == 0 else "tx_timestamp",
            "chunk_times": [sent + 0.002], "chunk_times_loop": [sent + 0.0025],
        })  # fmt: skip
        # engine: request in 0.1 ms after the send, first token out 1.8 ms later
        log.append({
            "request_id": rid, "ttft_s": 0.0005, "t": sent + 0.0019, "rx_at": sent + 0.0001,
            "tx_at": sent + 0.0019, "ttft_kernel_s": 0.0018, "rx_source": "kernel",
            "tx_source": "tx_timestamp",
        })  # fmt: skip
    recs.append({"request_id": "failed", "ok": False, "sent_at": 1.0, "first_token_at": None})
    _write(tmp_path / "r.jsonl", recs)
    _write(tmp_path / "t.jsonl", log)
    got = cc.ttft_error(tmp_path / "r.jsonl", tmp_path / "t.jsonl")
    assert got["truth"] == "kernel" and got["matched"] == got["ok"] == 10
    assert got["client_kernel"] == 10 and got["fresh"] == 1
    assert got["p50_s"] == pytest.approx(0.0002, abs=2e-6)  # 2 ms - 1.8 ms
    assert got["up_p50_s"] == pytest.approx(0.0001, abs=2e-6)
    assert got["down_p50_s"] == pytest.approx(0.0001, abs=2e-6)
    assert got["lag_p99_s"] == pytest.approx(0.0005, abs=2e-6)
    assert got["pooled_p99_s"] == pytest.approx(0.0002, abs=2e-6)


def test_ttft_error_falls_back_to_the_loop_truth_and_keeps_the_sign(tmp_path: Path) -> None:
    cc = _bench()
    recs = [{"request_id": "a", "ok": True, "sent_at": 10.0, "first_token_at": 10.001}]
    # the engine's loop-time TTFT is longer than what the client saw: a negative error
    log = [{"request_id": "a", "ttft_s": 0.003, "t": 10.0011}]
    _write(tmp_path / "r.jsonl", recs)
    _write(tmp_path / "t.jsonl", log)
    got = cc.ttft_error(tmp_path / "r.jsonl", tmp_path / "t.jsonl")
    assert got["truth"] == "loop" and got["client_kernel"] == 0
    assert got["p50_s"] == pytest.approx(-0.002, abs=2e-6)
    assert got["lag_p99_s"] is None


def test_h2load_rate_line() -> None:
    cc = _bench()
    text = "finished in 3.01s, 228.33 req/s, 1.69MB/s\nrequests: 685 total"
    m = cc._H2LOAD_RATE.search(text)
    assert m is not None and float(m.group(1)) == 228.33


def test_report_ends_with_cost_vs_floor_then_the_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 24: ``cost_vs_floor`` (ours / h2load CPU per request = h2load's req/core-s over
    ours) before the last line, which stays ``ratio_vs_best_peer``; ``nan`` without a floor."""
    cc = _bench()
    a = type("A", (), {"ttft_duration_s": 1.0})()
    ours = cc.Run("ours", engine_rps=900.0, req_per_core_s=1000.0, cpu_util=1.0)
    floor = cc.Run("h2load", engine_rps=1000.0, req_per_core_s=1600.0, cpu_util=1.0)
    peer = cc.Run("locust", engine_rps=400.0, req_per_core_s=400.0, cpu_util=1.0)
    cc._report([ours, floor, peer], {}, [], a)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2:] == ["cost_vs_floor=1.600", "ratio_vs_best_peer=2.500"]
    cc._report([ours, peer], {}, [], a)
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-2:] == ["cost_vs_floor=nan", "ratio_vs_best_peer=2.500"]
    assert "WARNING" not in out  # no run-queue wait measured: nothing to flag
    # a run that waited for its CPU a third of its window was taken on a shared machine
    ours.runq_share, peer.runq_share = 0.38, 0.02
    cc._report([ours, peer], {}, [], a)
    warned = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("WARNING")]
    assert warned and warned[0].startswith("WARNING: ours waited for a CPU over 10% of its window")


def test_closed_loop_keeps_its_concurrency_and_records_every_attempt(tmp_path: Path) -> None:
    """Our closed-loop row (since issue 20 ``run_load`` records a request due at a full cap as
    ``not_sent``, so the closed loop sends each worker's next attempt when its last one ends)."""
    from chaoslib_infer.load.client import LoadSpec
    from chaoslib_infer.load.fakeserver import FakeServer
    from chaoslib_infer.load.records import read_records

    cc = _bench()
    with FakeServer(replica="cl") as srv:
        spec = LoadSpec(url=f"{srv.url}/mode=ok,tokens=4", api="completions", rate_rps=1.0,
                        duration_s=0.5, max_concurrency=4, transport="raw")  # fmt: skip
        out = tmp_path / "r.jsonl"
        summ = cc._closed_loop(spec, str(out))
        n_arrivals = len(srv.arrivals)
    recs = read_records(out)
    assert summ["failed"] == 0 and summ["ok"] == len(recs) == n_arrivals > 8
    assert all(r["ok"] and r["output_tokens"] == 4 for r in recs)
    assert summ["chunk_path"] in ("compiled", "python") and summ["time_source"] in (
        "kernel", "loop", "mixed")  # fmt: skip
    assert len({r["request_id"] for r in recs}) == len(recs)
