"""Kernel chunk times in the raw transport (issue 16): stamps present, ordered, kernel <= loop,
the loop-time fallback stated in the record, the client-lag figure computed. Behaviour only: no
wall-clock threshold (the one timing assertion compares the lag with a block the test causes)."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from chaoslib_infer.load import kerneltime
from chaoslib_infer.load.client import (
    ERROR_CLASSES,
    LoadSpec,
    build_body,
    make_session,
    run_load_blocking,
    send_attempt,
)
from chaoslib_infer.load.fakeserver import FakeServer
from chaoslib_infer.load.records import OPTIONAL_FIELDS, RECORD_FIELDS, read_records
from chaoslib_infer.measure import chunkpath
from chaoslib_infer.measure.metrics import client_lag_s, window_stats

# timing-sensitive: scripts/quickstart test runs it alone, after the parallel pass
pytestmark = [pytest.mark.serial]

LOOP_FIELDS = (
    "sent_source",
    "sent_at_loop",
    "first_byte_at_loop",
    "first_token_at_loop",
    "chunk_times_loop",
    "end_at_loop",
)
SENT_SOURCES = ("tx_timestamp", "send_return", "connect", "loop")


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen()
        a = socket.create_connection(lst.getsockname())
        b, _ = lst.accept()
    return a, b


def _platform_stamps() -> bool:
    a, b = _tcp_pair()
    try:
        return kerneltime.enable(a, tx=False)[0]
    finally:
        a.close()
        b.close()


needs_stamps = pytest.mark.skipif(not _platform_stamps(), reason="no kernel socket stamps here")


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    with FakeServer(replica="kts") as srv:
        yield srv


def attempts(
    url: str,
    n: int = 2,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
    **kw: Any,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``n`` attempts in a row on one raw session (the second reuses the connection), and the
    session's timing summary."""
    spec = LoadSpec(url=url, transport="raw", **kw)

    async def go() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        out = []
        async with make_session(spec) as s:
            body = json.dumps(build_body(spec, random.Random(0))).encode()
            for i in range(n):
                out.append(await send_attempt(s, spec, body, f"k-{i}", 1, None))
            summary = s.timing_summary()  # type: ignore[union-attr]
        return out, summary

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(go())


def check_kernel_record(r: dict[str, Any]) -> None:
    assert r["time_source"] == "kernel"
    assert [k for k in r if k not in OPTIONAL_FIELDS] == list(RECORD_FIELDS)
    for k in LOOP_FIELDS:
        assert k in r, k
    assert r["sent_source"] in SENT_SOURCES
    kt, lt = r["chunk_times"], r["chunk_times_loop"]
    assert len(kt) == len(lt) == r["output_tokens"]
    assert kt == sorted(kt) and lt == sorted(lt)
    assert all(k <= lp for k, lp in zip(kt, lt, strict=True))  # the kernel saw it first
    for k in ("sent_at", "first_byte_at", "first_token_at", "end_at"):
        if r[k] is not None:
            assert r[k] <= r[k + "_loop"], k
    if r["ok"]:
        assert r["sent_at"] <= r["first_byte_at"] <= r["first_token_at"] <= r["end_at"]
        assert r["first_token_at"] == kt[0] and r["first_token_at_loop"] == lt[0]
    json.dumps(r, allow_nan=False)


@needs_stamps
@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_kernel_times_present_ordered_and_before_loop(server: FakeServer, loop_name: str) -> None:
    factory = uvloop.new_event_loop if loop_name == "uvloop" else None
    recs, summary = attempts(server.url + "/mode=ok,tokens=6,itl=0.003", 3, factory)
    for r in recs:
        assert r["ok"], r["error"]
        check_kernel_record(r)
    # a new connection's send time is the attempt's start (its connect is in TTFT); a pooled
    # one's is when the request bytes left (the kernel's transmit stamp, or just after send)
    assert recs[0]["sent_source"] == "connect"
    assert {r["sent_source"] for r in recs[1:]} <= {"tx_timestamp", "send_return"}
    assert summary["time_source"] == "kernel" and summary["kernel_attempts"] == 3
    assert summary["client_lag_reads"] >= 3
    for k in ("p50_client_lag_s", "p99_client_lag_s", "max_client_lag_s"):
        assert isinstance(summary[k], float) and summary[k] >= 0.0


@needs_stamps
def test_error_classes_unchanged_on_kernel_and_loop_time(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    cases = {
        "/mode=http,status=429": "http_429",
        "/mode=http,status=503": "http_5xx",
        "/mode=reset,k=2": "reset",
        "/mode=truncated,tokens=3": "truncated",
        "/mode=garbled,tokens=3": "garbled",
        "/mode=ok,tokens=3": None,
    }
    for mode in ("on", "off"):
        monkeypatch.setenv(kerneltime.ENV, mode)
        for path, want in cases.items():
            (r,), _ = attempts(server.url + path, 1)
            assert r["error_class"] == want, (mode, path, r["error"])
            assert r["error_class"] is None or r["error_class"] in ERROR_CLASSES
            assert r["time_source"] == ("kernel" if mode == "on" else "loop")


def _assert_loop_record(r: dict[str, Any]) -> None:
    assert r["time_source"] == "loop"
    assert not any(k in r for k in LOOP_FIELDS)
    assert r["chunk_times"] == sorted(r["chunk_times"])
    assert r["sent_at"] <= r["first_token_at"] <= r["end_at"]


def test_fallback_forced_off(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kerneltime.ENV, "off")
    recs, summary = attempts(server.url + "/mode=ok,tokens=4", 2)
    for r in recs:
        assert r["ok"]
        _assert_loop_record(r)
    assert summary["time_source"] == "loop" and summary["loop_attempts"] == 2
    assert summary["p99_client_lag_s"] is None and summary["client_lag_reads"] == 0


def test_fallback_platform_without_stamps(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kerneltime, "enable", lambda sock, tx=True: (False, False))
    recs, summary = attempts(server.url + "/mode=ok,tokens=4", 2)
    for r in recs:
        assert r["ok"]
        _assert_loop_record(r)
    assert summary["time_source"] == "loop"


@needs_stamps
def test_fallback_read_without_stamp(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stamps switched on but a read comes without one: the whole record is on loop time. (The
    pure read is the one a test can deprive of its stamps; the compiled read's unstamped result
    is the same, tests/test_recv_path.py::test_unstamped_socket.)"""
    monkeypatch.setenv(chunkpath.ENV, "python")
    monkeypatch.setattr(kerneltime, "rx_stamp", lambda anc: None)
    recs, summary = attempts(server.url + "/mode=ok,tokens=4,itl=0.002", 2)
    for r in recs:
        assert r["ok"]
        _assert_loop_record(r)
    assert summary["time_source"] == "loop" and summary["client_lag_reads"] == 0


@needs_stamps
def test_rx_only_mode_times_the_send_after_it_returned(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(kerneltime.ENV, "rx")
    recs, _ = attempts(server.url + "/mode=ok,tokens=3", 2)
    for r in recs:
        check_kernel_record(r)
    assert recs[1]["sent_source"] == "send_return"
    assert recs[1]["sent_at"] == recs[1]["sent_at_loop"]


def test_bad_mode_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kerneltime.ENV, "sometimes")
    with pytest.raises(ValueError, match=kerneltime.ENV):
        kerneltime.mode()


class _LateServer:
    """Answers one stream only once told to, so the test can block the client's loop first."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.got_request = threading.Event()
        self.go = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        c, _ = self.sock.accept()
        with c:
            c.settimeout(10)
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += c.recv(65536)
            head, _, rest = buf.partition(b"\r\n\r\n")
            n = next(
                int(x.split(b":")[1]) for x in head.split(b"\r\n")
                if x.lower().startswith(b"content-length")
            )  # fmt: skip
            while len(rest) < n:
                rest += c.recv(65536)
            self.got_request.set()
            self.go.wait(10)
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
            for k in range(4):
                fin = b'"length"' if k == 3 else b"null"
                ev = b'data: {"choices":[{"index":0,"text":"t%d","finish_reason":%s}]}\n\n' % (
                    k,
                    fin,
                )
                c.sendall(b"%x\r\n%s\r\n" % (len(ev), ev))
            ev = b"data: [DONE]\n\n"
            c.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(ev), ev))
            time.sleep(0.5)

    def close(self) -> None:
        self.go.set()
        self.sock.close()
        self.thread.join(5)


@needs_stamps
def test_client_lag_is_measured_when_the_loop_is_blocked(tmp_path: Path) -> None:
    """The reply arrives while the client's loop is blocked for ``block_s``: the kernel times are
    the arrival, the loop times the handling, and their difference is the lag figure."""
    block_s = 0.05
    srv = _LateServer()
    spec = LoadSpec(url=f"http://127.0.0.1:{srv.port}", api="completions", transport="raw")

    async def blocker() -> None:
        while not srv.got_request.is_set():
            await asyncio.sleep(0.001)
        srv.go.set()
        time.sleep(block_s)  # the loop is busy: the reply waits in the socket

    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        async with make_session(spec) as s:
            body = json.dumps(build_body(spec, random.Random(0))).encode()
            b = asyncio.create_task(blocker())
            rec = await send_attempt(s, spec, body, "late-1", 1, None)
            await b
            return rec, s.timing_summary()  # type: ignore[union-attr]

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            rec, summary = runner.run(go())
    finally:
        srv.close()
    assert rec["ok"], rec["error"]
    check_kernel_record(rec)
    lag = rec["first_token_at_loop"] - rec["first_token_at"]
    assert lag >= block_s / 2  # the stamp is the arrival, not the handling
    assert summary["max_client_lag_s"] >= block_s / 2
    assert summary["p99_client_lag_s"] is not None
    ws = window_stats([rec])
    assert ws["client_lag_reads"] >= 1 and ws["kernel_time_fraction"] == 1.0
    assert ws["max_client_lag_s"] == pytest.approx(max(client_lag_s([rec])))
    assert ws["p99_client_lag_s"] >= block_s / 2


@needs_stamps
def test_run_load_summary_and_window_stats_report_the_lag(
    server: FakeServer, tmp_path: Path
) -> None:
    spec = LoadSpec(url=server.url + "/mode=ok,tokens=4", rate_rps=80, duration_s=0.6, seed=5)
    summary = run_load_blocking(spec, tmp_path / "r.jsonl")
    recs = read_records(tmp_path / "r.jsonl")
    assert recs and all(r["ok"] for r in recs)
    for r in recs:
        check_kernel_record(r)
    assert summary["time_source"] == "kernel" and summary["kernel_attempts"] == len(recs)
    assert summary["client_lag_reads"] >= len(recs)
    assert 0.0 <= summary["p50_client_lag_s"] <= summary["p99_client_lag_s"]
    assert summary["p99_client_lag_s"] <= summary["max_client_lag_s"] + 1e-6
    ws = window_stats(recs)
    assert ws["kernel_time_fraction"] == 1.0 and ws["client_lag_reads"] >= len(recs)
    assert 0.0 <= ws["p50_client_lag_s"] <= ws["p99_client_lag_s"]


def test_window_stats_lag_from_records() -> None:
    """One lag per read (a run of equal loop times), over kernel records only."""
    base = {"ok": True, "error_class": None, "intended_at": 0.0, "sent_at": 0.0, "end_at": 1.0,
            "first_token_at": 0.1, "output_tokens": 3}  # fmt: skip
    k = {**base, "time_source": "kernel", "chunk_times": [0.1, 0.1, 0.3],
         "chunk_times_loop": [0.102, 0.102, 0.3005]}  # fmt: skip
    lp = {**base, "time_source": "loop", "chunk_times": [0.1, 0.2, 0.3]}
    lags = client_lag_s([k, lp])
    assert lags == pytest.approx([0.002, 0.0005])
    ws = window_stats([k, lp])
    assert ws["client_lag_reads"] == 2 and ws["kernel_time_fraction"] == 0.5
    assert ws["max_client_lag_s"] == pytest.approx(0.002)
    assert window_stats([lp])["p99_client_lag_s"] is None
    assert window_stats([lp])["kernel_time_fraction"] == 0.0


def test_lag_stats_percentiles() -> None:
    st = kerneltime.LagStats()
    assert st.summary() == {"p50_client_lag_s": None, "p99_client_lag_s": None,
                            "max_client_lag_s": None, "client_lag_reads": 0}  # fmt: skip
    for us in range(1, 1001):  # 1 us .. 1 ms: exact below 1,024 us
        st.add(us / 1e6)
    st.add(-0.5)  # a negative lag counts as 0
    assert st.n == 1001
    assert st.percentile_s(50) == pytest.approx(500e-6)
    assert st.percentile_s(99) == pytest.approx(990e-6)
    st.add(0.123456)  # above 1,024 us: within 0.1 %
    assert st.percentile_s(100) == pytest.approx(0.123456, rel=1e-3)
    assert st.summary()["max_client_lag_s"] == 0.123456


@needs_stamps
def test_pending_transmit_stamp_does_not_stall_reading_on_uvloop() -> None:
    """A transmit stamp left on a socket's error queue makes it report EPOLLERR; libuv would stop
    watching such a socket for good. Through the Poller the socket is still read afterwards."""
    a, b = _tcp_pair()
    got: list[bytes] = []

    async def go() -> None:
        loop = asyncio.get_running_loop()
        a.setblocking(False)
        rx, tx = kerneltime.enable(a, tx=True)
        assert rx
        poller = kerneltime.poller_for(loop)
        done = asyncio.Event()

        def readable() -> None:
            try:
                data = a.recv(65536)
            except BlockingIOError:
                kerneltime.tx_stamp(a)  # the error-queue wake-up drains the stamp
                return
            got.append(data)
            if b"".join(got).endswith(b"two"):
                done.set()

        poller.add(a.fileno(), readable)
        a.send(b"x")  # leaves a transmit stamp (when tx) that nobody reads now
        await asyncio.sleep(0.02)
        b.sendall(b"one")
        await asyncio.sleep(0.02)
        b.sendall(b"two")
        await asyncio.wait_for(done.wait(), 5)
        poller.remove(a.fileno())

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(go())
    finally:
        a.close()
        b.close()
    assert b"".join(got) == b"onetwo"


@needs_stamps
def test_first_read_of_a_lone_connection_is_stamped() -> None:
    """The kernel switches stamping on deferred when the first stamped socket asks (CI read
    "loop" records for one-attempt sessions): ``hold_stamps`` keeps it on, so the first read of a
    new connection that is the only stamped TCP socket carries a stamp, 20 times in a row."""
    assert kerneltime.hold_stamps()
    for _ in range(20):
        a, b = _tcp_pair()
        try:
            assert kerneltime.enable(a, tx=True)[0]
            b.sendall(b"x")
            a.settimeout(2)
            data, anc, _, _ = a.recvmsg(16, kerneltime.ANC_SIZE)
            assert data == b"x"
            assert kerneltime.rx_stamp(anc) is not None
        finally:
            a.close()
            b.close()
