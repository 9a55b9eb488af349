"""StreamStats records values in vectorised batches: same percentiles as one value at a time."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from chaoslib_infer.load.records import read_records
from chaoslib_infer.load.soak import StreamStats, stream_report
from chaoslib_infer.measure.metrics import window_stats


def _records(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        sent = 1.8e9 + i * 0.003
        ok = rng.random() > 0.1
        toks = rng.choice((1, 2, 7, 32, 129))
        ft = sent + rng.lognormvariate(-4, 1.5)  # spans many HDR buckets (us .. minutes)
        ct = [ft]
        for _ in range(toks - 1):
            ct.append(ct[-1] + rng.choice((0.0, 1e-7, rng.lognormvariate(-5, 2))))
        out.append({
            "request_id": f"r{i}", "attempt": 1, "final": True,
            "intended_at": sent - rng.random() * 0.01 + 0.002, "sent_at": sent,
            "status": 200 if ok else 503, "ok": ok, "error_class": None if ok else "http_5xx",
            "error": None if ok else "HTTP 503", "first_token_at": ft if ok else None,
            "chunk_times": ct if ok else [], "end_at": ct[-1] + 1e-4,
            "output_tokens": toks, "tokens_source": "usage", "replica": "r0", "text_len": toks,
        })  # fmt: skip
    return out


KEYS = (
    "p50_e2e_s", "p95_e2e_s", "p99_e2e_s", "p999_e2e_s", "p50_ttft_s", "p99_ttft_s",
    "p50_itl_s", "p99_itl_s", "p50_tpot_s", "p99_tpot_s",
)  # fmt: skip


@pytest.mark.parametrize("flush_every", [1, 7, 100_000])
def test_batched_percentiles_equal_per_value_reference(tmp_path: Path, flush_every: int) -> None:
    """window_stats records every value one by one (percentiles_s): the reference."""
    recs = _records(600, seed=flush_every)
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    got = stream_report(path)  # one batch size ...
    batched = StreamStats(flush_every)  # ... and another
    for r in recs:
        batched.add(r)
    assert batched.summary() == got
    ref = window_stats(read_records(path))
    assert got["requests"] == ref["requests"] == 600
    assert got["ok"] == ref["ok"] and 0 < got["ok"] < 600
    for key in KEYS:
        assert got[key] == ref[key], key
    assert got["p99_send_lag_s"] == ref["p99_send_lag_s"]
    # every gap inside a record counted, none across two records
    gaps = sum(max(len(r["chunk_times"]) - 1, 0) for r in recs)
    assert batched.h["itl"].get_total_count() == gaps


def test_summary_between_adds_flushes() -> None:
    st = StreamStats(10_000)
    recs = _records(50, seed=3)
    for r in recs[:20]:
        st.add(r)
    first = st.summary()
    assert first["requests"] == 20 and first["p50_e2e_s"] is not None
    for r in recs[20:]:
        st.add(r)
    ref = window_stats(recs)
    assert st.summary()["p99_e2e_s"] == ref["p99_e2e_s"]
    assert st.h["e2e"].get_total_count() == ref["ok"]


def test_non_finite_and_out_of_range_values_are_clamped_or_skipped() -> None:
    st = StreamStats()
    base = _records(1, seed=1)[0] | {"ok": True, "error_class": None}
    st.add(base | {"end_at": float("nan"), "chunk_times": [1.0, float("inf")]})
    st.add(base | {"end_at": base["sent_at"] + 10_000.0, "chunk_times": [2.0, 1.0]})
    s = st.summary()
    assert s["requests"] == 2
    assert s["p99_e2e_s"] == pytest.approx(3600.0, rel=1e-3)  # clamped to the 1 h top
    assert s["p50_itl_s"] == 1e-6  # a negative gap clamps to 1 us; the infinite one is skipped
    assert st.h["itl"].get_total_count() == 1
