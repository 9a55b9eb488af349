"""Trace replay (``chaoslib_infer.load.trace``): a Mooncake / AIPerf JSONL trace replays with its
arrival offsets (time-scaled) and request sizes against the fake server; bad traces are one line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from chaoslib_infer.load.client import LoadSpec, run_load_blocking
from chaoslib_infer.load.fakeserver import FakeServer
from chaoslib_infer.load.records import read_records
from chaoslib_infer.load.trace import (
    TraceRequest,
    read_trace,
    trace_offsets,
    trace_prompt,
    trace_summary,
)

#: (timestamp ms, input_length, output_length, hash_ids); out of order on purpose (sorted on read)
ROWS: list[tuple[int, int, int, list[int]]] = [
    (1000, 40, 3, [1, 2]),
    (0, 12, 5, []),
    (150, 30, 2, [1]),
    (160, 30, 4, [1]),
    (400, 8, 6, []),
    (1300, 20, 1, [7]),
    (1310, 20, 2, [7]),
    (1800, 16, 3, []),
]


class BodyServer(FakeServer):
    """The fake server, also keeping every request body by its X-Request-Id."""

    def __init__(self) -> None:
        super().__init__(replica="tr")
        self.bodies: dict[str, dict[str, Any]] = {}

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.bodies[request.headers.get("X-Request-Id", "")] = await request.json()
        return await super()._chat(request)


@pytest.fixture(scope="module")
def server() -> Iterator[BodyServer]:
    srv = BodyServer()
    with srv:
        yield srv


def write_trace(path: Path, rows: list[tuple[int, int, int, list[int]]] = ROWS) -> Path:
    with path.open("w") as fh:
        for ts, i, o, h in rows:
            obj: dict[str, Any] = {"timestamp": ts, "input_length": i, "output_length": o}
            if h:
                obj["hash_ids"] = h
            fh.write(json.dumps(obj) + "\n")
        fh.write("\n")
    return path


def test_read_trace_sorted_and_scaled(tmp_path: Path) -> None:
    tr = read_trace(write_trace(tmp_path / "t.jsonl"))
    assert [r.timestamp_ms for r in tr] == sorted(ts for ts, *_ in ROWS)
    assert tr[0] == TraceRequest(0.0, 12, 5, ())
    assert trace_offsets(tr, 2.0)[-1] == pytest.approx(0.9)
    s = trace_summary(tr, 2.0)
    assert s["requests"] == 8 and s["duration_s"] == pytest.approx(0.9)
    assert s["shared_prefix_requests"] == 3  # two more [1...] and one more [7]


@pytest.mark.parametrize(
    "line,msg",
    [
        ('{"timestamp": 1, "input_length": 3}', "line 2: missing 'output_length'"),
        ('{"timestamp": -1, "input_length": 3, "output_length": 1}', "line 2: timestamp"),
        ('{"timestamp": 1, "input_length": 0, "output_length": 1}', "line 2: input_length"),
        ('{"timestamp": 1, "input_length": 2.5, "output_length": 1}', "line 2: input_length"),
        ('{"timestamp": 1, "input_length": 2, "output_length": true}', "line 2: output_length"),
        ('{"timestamp": 1, "input_length": 2, "output_length": 1, "hash_ids": "x"}', "hash_ids"),
        ("[1, 2]", "line 2: not a JSON object"),
        ("{oops", "line 2: not valid JSON"),
    ],
)
def test_bad_trace_lines(tmp_path: Path, line: str, msg: str) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1}\n' + line + "\n")
    with pytest.raises(ValueError, match=msg):
        read_trace(p)


def test_empty_or_missing_trace(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no request"):
        read_trace(tmp_path / "e.jsonl")
    with pytest.raises(ValueError, match="cannot read"):
        read_trace(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="speed"):
        trace_offsets([TraceRequest(0, 1, 1)], 0)


def test_prompts_share_hash_prefixes_and_keep_a_nonce() -> None:
    import random

    rng = random.Random(0)
    a = trace_prompt(TraceRequest(0, 700, 1, (5, 6)), rng, block_size=512).split()
    b = trace_prompt(TraceRequest(0, 600, 1, (5, 9)), rng, block_size=512).split()
    c = trace_prompt(TraceRequest(0, 10, 1, ()), rng).split()
    assert (len(a), len(b), len(c)) == (700, 600, 10)
    assert a[:512] == b[:512] and a[512:599] != b[512:599]  # block 5 shared, 6 vs 9 not
    assert c[0].startswith("[") and c[0] != a[699]  # nonce first without hash ids
    nonces = [w for w in a + b if w.startswith("[")]
    assert len(nonces) == 2 and nonces[0] != nonces[1]


def test_trace_replays_offsets_and_sizes(server: BodyServer, tmp_path: Path) -> None:
    tr_path = write_trace(tmp_path / "t.jsonl")
    spec = LoadSpec(url=server.url + "/mode=ok,tokens=2", trace=str(tr_path), trace_speed=2.0)
    n0 = len(server.arrivals)
    summary = run_load_blocking(spec, tmp_path / "rec.jsonl")
    recs = sorted(read_records(tmp_path / "rec.jsonl"), key=lambda r: r["intended_at"])
    assert summary["sent"] == summary["scheduled"] == len(ROWS) == len(recs)
    assert all(r["ok"] for r in recs)
    want = trace_offsets(read_trace(tr_path), 2.0)
    got = [r["intended_at"] - summary["started_at"] for r in recs]
    assert got == pytest.approx(want, abs=1e-6)  # the schedule is the trace's, scaled
    lags = [r["sent_at"] - r["intended_at"] for r in recs]
    # the schedule lag is measured as for any schedule (the records' send minus intended time;
    # the summary's at the concurrency gate, before the body is built)
    assert 0 <= summary["max_send_lag_s"] <= max(lags) + 1e-3 and max(lags) < 0.05
    arrivals = dict(server.arrivals[n0:])
    first = arrivals[recs[0]["request_id"]]
    for r, off in zip(recs, want, strict=True):  # arrivals at the server keep the offsets
        assert arrivals[r["request_id"]] - first == pytest.approx(off, abs=0.03)
    ordered = sorted(ROWS)
    for r, (_, inp, outp, _h) in zip(recs, ordered, strict=True):
        body = server.bodies[r["request_id"]]
        assert body["max_tokens"] == outp
        assert len(body["messages"][0]["content"].split()) == inp
    # requests 2 and 3 (timestamps 150, 160) share block 1: the same leading words
    p2, p3 = (server.bodies[recs[k]["request_id"]]["messages"][0]["content"] for k in (1, 2))
    assert p2.split()[:29] == p3.split()[:29] and p2 != p3


def test_soak_cli_with_a_trace(server: BodyServer, tmp_path: Path) -> None:
    tr = write_trace(tmp_path / "t.jsonl")
    out = tmp_path / "soak"
    cmd = [sys.executable, "-m", "chaoslib_infer.cli", "load", "soak", "--target",
           server.url + "/mode=ok,tokens=2", "--trace", str(tr), "--trace-speed", "4",
           "--out", str(out), "--client-ceiling", "0"]  # fmt: skip
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["valid"] and report["sent"] == len(ROWS)
    assert report["trace"]["requests"] == len(ROWS) and report["trace"]["speed"] == 4
    assert report["stats"]["requests"] == len(ROWS)
    assert time.monotonic() - t0 < 30
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    res = subprocess.run([*cmd[:8], str(bad), "--out", str(tmp_path / "x")], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "missing 'input_length'" in res.stderr
    assert "Traceback" not in res.stderr


def test_three_phase_burst_is_the_trace(server: BodyServer, tmp_path: Path) -> None:
    tr = write_trace(tmp_path / "t.jsonl")
    out = tmp_path / "tp"
    cmd = [sys.executable, "-m", "chaoslib_infer.cli", "load", "three-phase", "--target",
           server.url + "/mode=ok,tokens=2", "--single-n", "2", "--ramp", "2", "--step-s", "0.5",
           "--trace", str(tr), "--trace-speed", "4", "--out", str(out), "--client-ceiling", "0"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    report = json.loads((out / "report.json").read_text())
    burst = report["steps"][-1]
    assert burst["step"] == "burst" and burst["trace"]["speed"] == 4
    assert burst["stats"]["requests"] == len(ROWS)
    assert burst["rate_rps"] == pytest.approx(len(ROWS) / (1.8 / 4), rel=0.01)
