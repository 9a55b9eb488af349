"""The load client against the fake SSE server: error classes, record fields, open-loop behaviour."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from labutil import free_port as _closed_port

from chaoslib_infer.load.client import (
    ERROR_CLASSES,
    LoadSpec,
    build_body,
    endpoint_url,
    make_session,
    run_load,
    run_load_blocking,
    send_attempt,
)
from chaoslib_infer.load.fakeserver import FakeServer
from chaoslib_infer.load.records import (
    OPTIONAL_FIELDS,
    RECORD_FIELDS,
    RecordWriter,
    read_records,
    unix_now,
)

# timing-sensitive: scripts/quickstart test runs it alone, after the parallel pass
pytestmark = [pytest.mark.serial]


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    with FakeServer(replica="fx") as srv:
        yield srv


def attempt(url: str, **kw: Any) -> dict[str, Any]:
    spec = LoadSpec(url=url, **kw)

    async def go() -> dict[str, Any]:
        async with make_session(spec) as s:
            body = json.dumps(build_body(spec, random.Random(0))).encode()
            return await send_attempt(s, spec, body, "req-1", 1, None)

    return asyncio.run(go())


def check_types(r: dict[str, Any]) -> None:
    assert [k for k in r if k not in OPTIONAL_FIELDS] == list(RECORD_FIELDS)
    assert isinstance(r["request_id"], str) and isinstance(r["attempt"], int)
    for k in ("intended_at", "sent_at", "end_at"):
        assert isinstance(r[k], float)
    for k in ("first_byte_at", "first_token_at"):
        assert r[k] is None or isinstance(r[k], float)
    assert r["status"] is None or isinstance(r["status"], int)
    assert isinstance(r["ok"], bool)
    assert r["ok"] == (r["error_class"] is None) == (r["error"] is None)
    assert r["error_class"] is None or r["error_class"] in ERROR_CLASSES
    assert isinstance(r["chunk_times"], list) and all(
        isinstance(t, float) for t in r["chunk_times"]
    )
    assert r["chunk_times"] == sorted(r["chunk_times"])
    assert isinstance(r["output_tokens"], int) and r["tokens_source"] in ("usage", "chunks")
    assert r["replica"] is None or isinstance(r["replica"], str)
    assert isinstance(r["text_len"], int)
    assert r["sent_at"] <= r["end_at"]
    json.dumps(r, allow_nan=False)


def test_ok_record_fields(server: FakeServer) -> None:
    before = unix_now()
    r = attempt(server.url + "/mode=ok,tokens=6,itl=0.005")
    check_types(r)
    assert r["ok"] and r["status"] == 200 and r["replica"] == "fx"
    assert before <= r["sent_at"] <= r["first_byte_at"] <= r["first_token_at"] <= r["end_at"]
    assert len(r["chunk_times"]) == 6 and r["chunk_times"][0] == r["first_token_at"]
    assert r["output_tokens"] == 6 and r["tokens_source"] == "usage"
    assert r["text_len"] == 6 * 3
    # spaced tokens: raw gaps about itl
    gaps = [b - a for a, b in zip(r["chunk_times"], r["chunk_times"][1:], strict=False)]
    assert min(gaps) > 0.003


def test_chunk_count_fallback_and_completions(server: FakeServer) -> None:
    r = attempt(server.url + "/mode=ok,tokens=5", include_usage=False, api="completions")
    check_types(r)
    assert r["ok"] and r["output_tokens"] == 5 and r["tokens_source"] == "chunks"


def test_cjk_split_bytewise(server: FakeServer) -> None:
    r = attempt(server.url + "/mode=ok,tokens=3,text=cjk,split=1")
    check_types(r)
    assert r["ok"] and r["text_len"] == 3 * 4


CASES = [
    ("mode=http,status=429", "http_429", 429),
    ("mode=http,status=503", "http_5xx", 503),
    ("mode=http,status=500", "http_5xx", 500),
    ("mode=http,status=400", "http_4xx", 400),
    ("mode=empty", "empty", 200),
    ("mode=nocontent", "empty", 200),
    ("mode=garbled", "garbled", 200),
    ("mode=badjson", "garbled", 200),
    ("mode=fffd", "garbled", 200),
    ("mode=truncated", "truncated", 200),
    ("mode=nodone", "truncated", 200),
    ("mode=reset,k=3,itl=0.005", "reset", 200),
    ("mode=reset,k=0", "reset", 200),
    ("mode=drop", "reset", None),
    ("mode=error,k=2", "stream_error", 200),
    ("mode=notsse", "stream_error", 200),
    ("mode=stall,k=0", "timeout_ttft", 200),
    ("mode=ok,delay=5", "timeout_ttft", None),
    ("mode=stall,k=2", "timeout_idle", 200),
    ("mode=ok,tokens=1000,itl=0.01", "timeout_total", 200),
]


@pytest.mark.parametrize("path,expected,status", CASES)
def test_error_classes(server: FakeServer, path: str, expected: str, status: int | None) -> None:
    r = attempt(server.url + "/" + path, ttft_timeout_s=0.4, idle_timeout_s=0.3, timeout_s=0.8)
    check_types(r)
    assert (r["ok"], r["error_class"], r["status"]) == (False, expected, status), r["error"]
    assert r["error"]
    if expected.startswith("timeout_"):
        limit = {"timeout_ttft": 0.4, "timeout_idle": 0.3, "timeout_total": 0.8}[expected]
        assert r["end_at"] - r["sent_at"] >= limit * 0.95
        assert r["end_at"] - r["sent_at"] < 0.8 + 0.5


def test_hang_after_done_is_ok(server: FakeServer) -> None:
    r = attempt(server.url + "/mode=hang", idle_timeout_s=2.0)
    assert r["ok"] and r["end_at"] - r["sent_at"] < 0.3


def test_connect_refused() -> None:
    r = attempt(f"http://127.0.0.1:{_closed_port()}")
    check_types(r)
    assert r["error_class"] == "connect" and r["status"] is None and r["replica"] is None


def test_connect_timeout() -> None:
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(0)
    port = ls.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):  # fill the accept queue: further SYNs are dropped
            c = socket.socket()
            c.setblocking(False)
            try:
                c.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            fillers.append(c)
        time.sleep(0.05)
        r = attempt(f"http://127.0.0.1:{port}", connect_timeout_s=0.3)
    finally:
        for c in fillers:
            c.close()
        ls.close()
    assert r["error_class"] == "timeout_connect", r["error"]


def test_endpoint_url_and_body() -> None:
    assert endpoint_url(LoadSpec(url="http://h:1/")) == "http://h:1/v1/chat/completions"
    assert (
        endpoint_url(LoadSpec(url="http://h:1/v1", api="completions"))
        == "http://h:1/v1/completions"
    )
    spec = LoadSpec(url="http://h:1", prompt_words=3)
    a, b = build_body(spec, random.Random(0)), build_body(spec, random.Random(0))
    pa, pb = a["messages"][0]["content"], b["messages"][0]["content"]
    assert pa.startswith("[") and pa != pb  # random nonce first, same seeded words after it
    assert pa.split("] ", 1)[1] == pb.split("] ", 1)[1]
    assert a["stream"] is True and a["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    "kw",
    [
        {"url": "ftp://x"},
        {"url": "http://h:1", "rate_rps": 0},
        {"url": "http://h:1", "duration_s": -1},
        {"url": "http://h:1", "max_concurrency": 0},
        {"url": "http://h:1", "api": "embeddings"},
        {"url": "http://h:1", "timeout_s": float("nan")},
    ],
)
def test_spec_validation(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        LoadSpec(**kw)


def test_run_load_open_loop(server: FakeServer, tmp_path: Path) -> None:
    out = tmp_path / "rec.jsonl"
    seen_before = len(server.request_ids)
    spec = LoadSpec(url=server.url + "/mode=ok,tokens=4", rate_rps=100, duration_s=1.5, seed=3)
    t0 = time.monotonic()
    summary = run_load_blocking(spec, out)
    assert time.monotonic() - t0 < 1.5 + 2
    recs = read_records(out)
    assert summary["sent"] == summary["scheduled"] == len(recs) == summary["ok"]
    assert summary["not_sent"] == 0 and summary["cancelled"] == 0
    # the cap from the plan: 150 requests in 1.5 s, a 30 s deadline: the floor of 1000
    assert summary["max_concurrency"] == 1000 and summary["cap_source"] == "plan"
    assert 1 <= summary["max_in_flight"] < 150
    assert summary["cap_fill"] == pytest.approx(summary["max_in_flight"] / 1000)
    assert summary["client_cpu_s"] > 0 and 0 < summary["client_cpu_share"] < 2
    for r in recs:
        check_types(r)
        assert r["attempt"] == 1
        assert 0 <= r["sent_at"] - r["intended_at"] < 0.1
    ids = [r["request_id"] for r in recs]
    assert len(set(ids)) == len(ids)
    assert sorted(server.request_ids[seen_before:]) == sorted(ids)  # X-Request-Id = request_id
    nonces = {p.split("]")[0] for p in server.prompts[seen_before:]}
    assert len(nonces) == len(ids)
    # intended times follow the seeded schedule
    intended = sorted(r["intended_at"] for r in recs)
    offs = spec.offsets()
    base = intended[0] - offs[0]
    assert [t - base for t in intended] == pytest.approx(offs, abs=1e-5)


def test_a_full_cap_records_due_requests_as_not_sent_and_never_delays_one(
    server: FakeServer, tmp_path: Path
) -> None:
    """Open loop at a full cap: every scheduled request is due at its time; one that finds the
    cap full is recorded ``not_sent`` with the number in flight, at once (never queued behind
    the cap, which would hide the wait: coordinated omission), and the schedule goes on."""
    out = tmp_path / "rec.jsonl"
    spec = LoadSpec(
        url=server.url + "/mode=ok,tokens=5,itl=0.04",  # ~0.2 s per request
        rate_rps=50,
        duration_s=1.0,
        max_concurrency=2,
        arrival="constant",
    )
    summary = run_load_blocking(spec, out)
    recs = read_records(out)
    not_sent = [r for r in recs if r["error_class"] == "not_sent"]
    sent = [r for r in recs if r["error_class"] != "not_sent"]
    assert summary["sent"] + summary["not_sent"] == summary["scheduled"] == len(recs) == 50
    assert len(not_sent) == summary["not_sent"] >= 50 - (2 * 1.0 / 0.2 + 4)
    assert len(sent) == summary["sent"] == summary["ok"]
    for r in not_sent:
        check_types(r)
        assert r["not_sent"] is True and r["ok"] is False and r["in_flight"] == 2
        assert r["final"] is True and r["end_at"] == r["sent_at"] and r["status"] is None
        assert "in-flight cap (2) was full (2 in flight)" in r["error"]
    lags = [r["sent_at"] - r["intended_at"] for r in recs]
    assert 0 <= max(lags) < 0.1  # nothing waited for a slot
    assert summary["max_send_lag_s"] < 0.1
    assert summary["max_in_flight"] == 2 and summary["cap_fill"] == 1.0
    assert summary["cap_source"] == "given"
    (phase,) = summary["phases"]
    assert (phase["scheduled"], phase["sent"], phase["not_sent"]) == (
        50,
        summary["sent"],
        summary["not_sent"],
    )


def test_the_plan_cap_is_the_schedule_rate_times_the_deadline_at_least_1000() -> None:
    """``plan_cap``: the most arrivals of any deadline-long stretch of the schedule (what a
    client that keeps up can have in flight at once), never below the floor."""
    from chaoslib_infer.load.inflight import plan_cap

    assert plan_cap([0.0, 0.5, 1.0, 1.2, 5.0], 0.3, floor=1) == 2  # [1.0, 1.3): 1.0, 1.2
    assert plan_cap([0.0, 0.5, 1.0, 1.2, 5.0], 1.0, floor=1) == 3  # [0.5, 1.5): 0.5, 1.0, 1.2
    assert plan_cap([0.0, 0.5, 1.0, 1.2, 5.0], 1.3, floor=1) == 4  # [0, 1.3)
    assert plan_cap([0.0, 0.5, 1.0], 10.0) == 1000
    steady = [i / 256 for i in range(256 * 60)]  # 256 req/s for 60 s, 10 s deadline: 2560
    assert plan_cap(steady, 10.0) == 2560
    spec = LoadSpec(url="http://h:1", rate_rps=200, duration_s=60, arrival="constant")
    assert spec.cap() == plan_cap(spec.offsets(), spec.max_logical_s()) > 2000  # 30.5 s deadline
    assert LoadSpec(url="http://h:1", max_concurrency=64).cap() == 64


def test_stop_event_records_in_flight_as_cut_off(server: FakeServer, tmp_path: Path) -> None:
    out = tmp_path / "rec.jsonl"
    spec = LoadSpec(url=server.url + "/mode=stall,k=1", rate_rps=20, duration_s=10, timeout_s=30)

    async def go() -> dict[str, Any]:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.5, stop.set)
        with RecordWriter(out) as w:
            return await run_load(spec, w, stop)

    t0 = time.monotonic()
    summary = asyncio.run(go())
    assert time.monotonic() - t0 < 2.0
    assert summary["stopped"] and summary["cancelled"] > 0
    # attempts on the wire at the stop are recorded as cut off (outcome unknown), never dropped
    recs = read_records(out)
    assert recs and len(recs) == summary["cancelled"]
    assert all(r["cut_off"] and r["error_class"] == "cut_off" and not r["ok"] for r in recs)
    assert all(0.0 <= r["in_flight_s"] <= 1.0 for r in recs)


def test_run_load_bounded_after_schedule(server: FakeServer, tmp_path: Path) -> None:
    spec = LoadSpec(
        url=server.url + "/mode=stall,k=1",
        rate_rps=10,
        duration_s=0.5,
        timeout_s=1.0,
        idle_timeout_s=None,
        ttft_timeout_s=None,
    )
    t0 = time.monotonic()
    summary = run_load_blocking(spec, tmp_path / "r.jsonl")
    took = time.monotonic() - t0
    assert took < 0.5 + 1.0 + 1.0
    recs = read_records(tmp_path / "r.jsonl")
    assert recs and all(r["error_class"] == "timeout_total" for r in recs)
    assert summary["failed"] == len(recs)


def test_progress_callback(server: FakeServer, tmp_path: Path) -> None:
    snaps: list[dict[str, Any]] = []
    spec = LoadSpec(url=server.url, rate_rps=40, duration_s=0.6)

    async def go() -> dict[str, Any]:
        with RecordWriter(tmp_path / "r.jsonl") as w:
            return await run_load(spec, w, on_progress=snaps.append, progress_interval_s=0.2)

    asyncio.run(go())
    assert snaps and {"t", "sent", "ok", "failed", "in_flight"} <= set(snaps[-1])
