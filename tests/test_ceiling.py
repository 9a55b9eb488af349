"""Client ceiling, the refusal rule, and sharded load whose merged percentiles equal one process's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from chaoslib_infer.load.ceiling import CeilingRefused, check_rate, measure_ceiling, sim_engine
from chaoslib_infer.load.records import read_records
from chaoslib_infer.load.shard import e2e_histogram, merge_histograms, run_sharded
from chaoslib_infer.measure.metrics import window_stats

# timing-sensitive: scripts/quickstart test runs it alone, after the parallel pass
pytestmark = [pytest.mark.serial]


def test_refusal_rule() -> None:
    check_rate(50, 100)  # exactly half: allowed
    with pytest.raises(CeilingRefused, match="--shards 2"):
        check_rate(51, 100)
    check_rate(150, 100, shards=3)
    with pytest.raises(CeilingRefused, match="--shards 4"):
        check_rate(151, 100, shards=3)
    check_rate(10_000, None)  # unknown ceiling: nothing refused


def test_ceiling_and_sharded_run(tmp_path: Path) -> None:
    with sim_engine(output_tokens=8) as url:
        res = measure_ceiling(url, duration_s=1.0, concurrency=8, max_tokens=8)
        assert res["failed"] == 0 and res["ceiling_rps"] > 20
        # a burst above half the ceiling is refused by the CLI (exit 2, one line) ...
        cmd = [sys.executable, "-m", "chaoslib_infer.cli", "load", "three-phase", "--target", url,
               "--out", str(tmp_path / "r"), "--single-n", "0", "--ramp", "", "--burst-s", "1",
               "--burst-rps", str(res["ceiling_rps"]), "--client-ceiling", str(res["ceiling_rps"])]  # fmt: skip
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and "use --shards 2" in p.stderr, p.stderr
        # ... and sharding splits it across processes
        out = run_sharded(url, 40.0, 1.5, 2, tmp_path / "sh", max_tokens=8, timeout_s=10)
    shard_recs = [read_records(f) for f in out["shard_files"]]
    merged = read_records(out["merged"])
    assert out["records"] == len(merged) == sum(len(r) for r in shard_recs) > 30
    assert all(r["ok"] for r in merged)
    assert len({r["request_id"] for r in merged}) == len(merged)
    one = e2e_histogram(merged)
    combined = merge_histograms(e2e_histogram(r) for r in shard_recs)
    for pct in (50, 90, 99, 99.9, 100):
        assert combined.get_value_at_percentile(pct) == one.get_value_at_percentile(pct)
    ws = window_stats([r for recs in shard_recs for r in recs])
    assert window_stats(merged)["p99_e2e_s"] == ws["p99_e2e_s"]
