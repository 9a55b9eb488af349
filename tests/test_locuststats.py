"""Locust-format CSV stats from records (``chaoslib_infer.load.locuststats``)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from chaoslib_infer.load.locuststats import (
    FAILURES_COLUMNS,
    HISTORY_COLUMNS,
    STATS_COLUMNS,
    write_locust_stats,
)
from chaoslib_infer.load.records import RecordWriter

T0 = 1_800_000_000.0


def rec(i: int, sent: float, e2e: float, ok: bool = True, cls: str | None = None) -> dict[str, Any]:
    chunks = [T0 + sent + 0.1 + 0.01 * k for k in range(5)] if ok else []
    return {
        "request_id": f"r{i}", "attempt": 1, "final": True, "intended_at": T0 + sent,
        "sent_at": T0 + sent, "status": 200 if ok else 503, "ok": ok, "error_class": cls,
        "error": None if ok else "HTTP 503: busy", "first_byte_at": T0 + sent + 0.05,
        "first_token_at": chunks[0] if chunks else None, "chunk_times": chunks,
        "end_at": T0 + sent + e2e, "output_tokens": 5 if ok else 0, "tokens_source": "usage",
        "replica": "r0", "text_len": 20 if ok else 0,
    }  # fmt: skip


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_stats_history_failures(tmp_path: Path) -> None:
    records = tmp_path / "records.jsonl"
    with RecordWriter(records) as w:
        for i in range(10):  # 10 ok attempts of 200..290 ms over the first 2 s
            w.write(rec(i, 0.2 * i, 0.2 + 0.01 * i))
        w.write(rec(10, 2.1, 0.5, ok=False, cls="http_5xx"))
        w.write(rec(11, 2.2, 0.5, ok=False, cls="http_5xx"))
        cut = rec(12, 2.3, 0.1, ok=False, cls="cut_off")
        cut["cut_off"] = True
        w.write(cut)
    paths = write_locust_stats(records)
    assert paths["stats"] == tmp_path / "records_stats.csv"
    with paths["stats"].open() as fh:
        assert next(csv.reader(fh)) == list(STATS_COLUMNS)
    stats = read(paths["stats"])
    assert [(r["Type"], r["Name"]) for r in stats] == [
        ("POST", "/v1/chat/completions"),
        ("", "Aggregated"),
    ]
    agg = stats[1]
    assert (agg["Request Count"], agg["Failure Count"]) == ("12", "2")  # cut_off left out
    assert agg["Min Response Time"].startswith("200") and float(agg["Max Response Time"]) == 500
    assert int(agg["100%"]) == 500 and 240 <= int(agg["50%"]) <= 260
    assert agg["TTFT 50%"] == "100" and agg["ITL 50%"] == "10" and agg["ITL 99%"] == "10"
    assert float(agg["Average Content Size"]) == 200 / 12
    elapsed = (2.2 + 0.5) - 0.0
    assert float(agg["Requests/s"]) == pytest.approx(12 / elapsed)
    assert float(agg["Output Tokens/s"]) == pytest.approx(50 / elapsed, abs=1e-3)
    fails = read(paths["failures"])
    assert list(fails[0]) == list(FAILURES_COLUMNS)
    assert [(f["Error"], f["Occurrences"]) for f in fails] == [("http_5xx: HTTP 503: busy", "2")]
    assert fails[0]["First Seen"].endswith("Z")
    hist = read(paths["history"])
    assert list(hist[0]) == list(HISTORY_COLUMNS)
    assert [int(h["Timestamp"]) - int(T0) for h in hist] == [0, 1, 2]
    assert [float(h["Requests/s"]) for h in hist] == [4.0, 5.0, 3.0]  # counted when they end
    assert [h["Total Request Count"] for h in hist] == ["4", "9", "12"]
    assert hist[-1]["Total Failure Count"] == "2" and hist[-1]["100%"] == "500"
    assert int(hist[0]["User Count"]) >= 1


def test_empty_records(tmp_path: Path) -> None:
    (tmp_path / "r.jsonl").write_text("")
    paths = write_locust_stats(tmp_path / "r.jsonl", prefix=tmp_path / "x")
    stats = read(paths["stats"])
    assert len(stats) == 1 and stats[0]["Request Count"] == "0" and stats[0]["50%"] == "N/A"
    assert read(paths["history"]) == [] and read(paths["failures"]) == []


def test_one_busy_second_is_compacted_without_changing_percentiles(tmp_path: Path) -> None:
    """1,100 records ending in one second, 64 chunks each: 69,300 inter-token gaps, more than a
    second holds raw before they become HDR bucket counts. The percentiles are those of an HDR
    histogram fed every value one by one (the library as the oracle)."""
    from hdrh.histogram import HdrHistogram

    records = tmp_path / "records.jsonl"
    oracle = HdrHistogram(1, 3600 * 1_000_000, 3)
    with RecordWriter(records) as w:
        for i in range(1100):
            sent = T0 + 0.2 + i * 1e-5
            gaps = [0.003 + 0.0001 * ((i + k) % 97) for k in range(63)]
            chunks = [sent + 0.01]
            for g in gaps:
                chunks.append(chunks[-1] + g)
            for a, b in zip(chunks, chunks[1:], strict=False):
                oracle.record_value(max(1, int((b - a) * 1e6)))
            r = rec(i, 0.2 + i * 1e-5, 0.0)
            r.update(chunk_times=chunks, first_token_at=chunks[0], end_at=T0 + 0.99)
            w.write(r)
    agg = read(write_locust_stats(records)["stats"])[1]
    assert agg["Request Count"] == "1100"
    for col, p in (("ITL 50%", 50), ("ITL 90%", 90), ("ITL 99%", 99)):
        assert int(agg[col]) == round(oracle.get_value_at_percentile(p) / 1000), col
    assert agg["TTFT 50%"] == "10"


def test_an_attempt_that_ended_before_the_first_send_counts_in_the_first_second(
    tmp_path: Path,
) -> None:
    records = tmp_path / "records.jsonl"
    with RecordWriter(records) as w:
        w.write(rec(0, 1.5, 0.2))
        early = rec(1, 1.6, 0.1, ok=False, cls="reset")
        early["end_at"] = T0 - 3.0  # a clock step: ended "before" it was sent
        w.write(early)
        w.write(rec(2, 2.5, 0.1, ok=False, cls="reset"))
        w.write(rec(3, 2.6, 0.1, ok=False, cls="http_5xx"))
        w.write(rec(4, 2.7, 0.1, ok=False, cls="http_5xx"))
    paths = write_locust_stats(records)
    hist = read(paths["history"])
    assert [int(h["Timestamp"]) - int(T0) for h in hist] == [1, 2]
    assert [float(h["Requests/s"]) for h in hist] == [2.0, 3.0]
    fails = read(paths["failures"])
    # a tie in count: the class that ended first comes first (reset, at T0 - 3)
    assert [(f["Error"].split(":")[0], f["Occurrences"]) for f in fails] == [
        ("reset", "2"),
        ("http_5xx", "2"),
    ]
