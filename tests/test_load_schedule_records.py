"""Schedules, records file and the shared clock."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest

from chaoslib_infer.load.records import RecordWriter, read_records, unix_now
from chaoslib_infer.load.schedule import constant_schedule, poisson_schedule


def test_poisson_rate_and_gaps_statistically_close() -> None:
    rate, dur = 200.0, 50.0
    offs = poisson_schedule(rate, dur, seed=7)
    n = len(offs)
    # expected 10000, sd 100: 5 sd tolerance
    assert abs(n - rate * dur) < 500
    assert offs == sorted(offs)
    assert 0 < offs[0] and offs[-1] < dur
    gaps = [b - a for a, b in zip(offs, offs[1:], strict=False)]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / rate, rel=0.05)
    # exponential: coefficient of variation ~ 1
    assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, abs=0.05)


def test_poisson_deterministic_per_seed() -> None:
    assert poisson_schedule(10, 5, seed=1) == poisson_schedule(10, 5, seed=1)
    assert poisson_schedule(10, 5, seed=1) != poisson_schedule(10, 5, seed=2)


def test_constant_schedule() -> None:
    s = constant_schedule(4, 1.0)
    assert s == [0.0, 0.25, 0.5, 0.75]
    assert len(constant_schedule(3, 2.0)) == 6
    assert constant_schedule(1, 0) == []


@pytest.mark.parametrize(
    "rate,dur", [(0, 1), (-1, 1), (float("nan"), 1), (1, -1), (1, float("inf"))]
)
def test_schedule_rejects_bad_values(rate: float, dur: float) -> None:
    with pytest.raises(ValueError):
        poisson_schedule(rate, dur)
    with pytest.raises(ValueError):
        constant_schedule(rate, dur)


def test_writer_and_reader(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    with RecordWriter(p) as w:
        w.write({"request_id": "a", "text": "你好"})
        # flushed per record: visible before close
        assert json.loads(p.read_text(encoding="utf-8").splitlines()[0])["text"] == "你好"
        w.write({"request_id": "b"})
        assert w.count == 2
    assert w.closed
    with pytest.raises(ValueError):
        w.write({"x": 1})
    assert [r["request_id"] for r in read_records(p)] == ["a", "b"]
    with RecordWriter(p, append=True) as w:
        w.write({"request_id": "c"})
    assert len(read_records(p)) == 3


def test_reader_tolerates_truncated_last_line(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\n\n{"a": 2}\n{"a": 3, "b": [1, 2')
    assert read_records(p) == [{"a": 1}, {"a": 2}]
    p.write_text('{"a": 1}\n{"a": 2, "b\n')
    assert read_records(p) == [{"a": 1}]
    p.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_records(p)


def test_unix_now_tracks_wall_clock() -> None:
    assert abs(unix_now() - time.time()) < 0.5
    a = unix_now()
    time.sleep(0.01)
    assert unix_now() - a >= 0.009


def test_record_line_same_values_as_the_standard_library() -> None:
    """orjson writes the line; the values read back are those ``json.dumps`` would write, and
    what the standard library refuses is still refused with its errors."""
    import dataclasses

    from chaoslib_infer.load.records import record_line

    rec = {
        "request_id": "r-é", "sent_at": 1_800_000_000.123456, "chunk_times": [1e-05, 2.5, 1e16],
        "ok": True, "error": None, "usage": {"n": [1, 2]}, "big": 2**70, "t": (1.0, 2.0),
    }  # fmt: skip
    line = record_line(rec)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    want = json.dumps(rec, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    assert json.loads(line) == json.loads(want)
    assert "r-é".encode() in line  # UTF-8, not \\u escapes (as ensure_ascii=False)
    for bad in ({"x": float("nan")}, {"x": [1.0, float("inf")]}, {"x": {"y": [float("-inf")]}}):
        with pytest.raises(ValueError, match="Out of range float"):
            record_line(bad)
    with pytest.raises(UnicodeEncodeError):
        record_line({"error": "\ud800"})

    @dataclasses.dataclass
    class D:
        a: int

    with pytest.raises(TypeError, match="not JSON serializable"):
        record_line({"x": D(1)})  # orjson would write it; the standard library refuses it
    assert json.loads(record_line({"x": [1e308, 1e308]})) == {"x": [1e308, 1e308]}
