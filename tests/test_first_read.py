"""The raw transport with the compiled chunk path (issue 24): the same records as the pure path
on the same replies; and why a late read's first output chunk cannot keep its own kernel stamp
(item 3: reading it alone was tried, measured and reverted; the kernel had merged the segments
before the read). Against local servers (no lab).
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvloop

from chaoslib_infer.load import kerneltime
from chaoslib_infer.load.client import LoadSpec, build_body, make_session, send_attempt
from chaoslib_infer.load.fakeserver import FakeServer
from chaoslib_infer.load.records import perf_to_unix
from chaoslib_infer.measure import chunkpath

# timing-sensitive: scripts/quickstart test runs it alone, after the parallel pass
pytestmark = [pytest.mark.serial]

COMPILED, WHY_NOT = chunkpath.compiled_available()


def _platform_stamps() -> bool:
    with socket.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen()
        a = socket.create_connection(lst.getsockname())
        b, _ = lst.accept()
    try:
        return kerneltime.enable(a, tx=False)[0]
    finally:
        a.close()
        b.close()


needs_stamps = pytest.mark.skipif(not _platform_stamps(), reason="no kernel socket stamps here")


class _TwoBurstServer:
    """Once told to, sends the head and the first output chunk, waits ``gap_s``, then the rest
    (two more chunks, the finish, ``[DONE]``): two bursts the kernel stamps ``gap_s`` apart."""

    def __init__(self, gap_s: float) -> None:
        self.gap_s = gap_s
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.got_request = threading.Event()
        self.go = threading.Event()
        #: ``time.perf_counter()`` just before the second burst was written
        self.second_at = 0.0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @staticmethod
    def _chunk(text: str, fin: str = "null") -> bytes:
        ev = b'data: {"choices":[{"index":0,"text":"%s","finish_reason":%s}]}\n\n' % (
            text.encode(),
            fin.encode(),
        )
        return b"%x\r\n%s\r\n" % (len(ev), ev)

    def _serve(self) -> None:
        c, _ = self.sock.accept()
        with c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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
                      b"Transfer-Encoding: chunked\r\n\r\n" + self._chunk("t0"))  # fmt: skip
            time.sleep(self.gap_s)
            self.second_at = time.perf_counter()
            ev = b"data: [DONE]\n\n"
            c.sendall(self._chunk("t1") + self._chunk("t2", '"length"')
                      + b"%x\r\n%s\r\n0\r\n\r\n" % (len(ev), ev))  # fmt: skip
            time.sleep(0.3)

    def close(self) -> None:
        self.go.set()
        self.sock.close()
        self.thread.join(5)


def _blocked_attempt(gap_s: float, block_s: float) -> tuple[dict[str, Any], float]:
    """One attempt whose whole reply (two bursts ``gap_s`` apart) arrives while the client's
    loop is blocked for ``block_s``: the kernel queues both bursts before the first read.

    Returns:
        The record and the unix time the second burst was written (the records' clock)."""
    srv = _TwoBurstServer(gap_s)
    spec = LoadSpec(url=f"http://127.0.0.1:{srv.port}", api="completions", transport="raw")

    async def blocker() -> None:
        while not srv.got_request.is_set():
            await asyncio.sleep(0.001)
        srv.go.set()
        time.sleep(block_s)  # the loop is busy: both bursts wait in the socket

    async def go() -> dict[str, Any]:
        async with make_session(spec) as s:
            body = json.dumps(build_body(spec, random.Random(0))).encode()
            b = asyncio.create_task(blocker())
            rec = await send_attempt(s, spec, body, "two-1", 1, None)
            await b
            return rec

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            rec = runner.run(go())
    finally:
        srv.close()
    return rec, perf_to_unix(srv.second_at)


@needs_stamps
def test_a_late_read_gets_the_newest_stamp() -> None:
    """Both bursts are queued before the client reads. Linux merges a segment into the unread
    tail of the receive queue and gives the merged buffer the newer segment's stamp
    (``tcp_try_coalesce``), so every stamp of this reply, the head's and the first chunk's
    included, is the second burst's arrival: ``gap_s`` late for TTFT. Reading the head and the
    first output chunk alone (issue 24 item 3; tried, the same stamps, reverted) cannot change
    that: what was merged before the read has one stamp. Only reading before the next segment
    arrives (a client loop that is not late) keeps a chunk's own stamp."""
    gap_s, block_s = 0.05, 0.2
    rec, second_at = _blocked_attempt(gap_s, block_s)
    assert rec["ok"] and rec["time_source"] == "kernel", rec
    ct = rec["chunk_times"]
    assert len(ct) == 3 and rec["first_token_at"] == ct[0]
    assert ct[0] >= second_at  # the first chunk (sent gap_s earlier) carries the later stamp
    assert ct[2] - rec["first_byte_at"] < gap_s / 5  # one stamp for the whole reply
    assert rec["first_token_at_loop"] - ct[0] >= block_s / 4  # and it was read late


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    with FakeServer(replica="cp") as srv:
        yield srv


MODES = [
    ("mode=ok,tokens=6", "chat"),
    ("mode=ok,tokens=6,text=cjk,split=7", "chat"),
    ("mode=ok,tokens=5,itl=0.002", "completions"),
    ("mode=garbled", "chat"),
    ("mode=badjson", "chat"),
    ("mode=fffd", "chat"),
    ("mode=error,k=2", "chat"),
    ("mode=truncated", "completions"),
    ("mode=nodone", "chat"),
    ("mode=nocontent", "chat"),
    ("mode=notsse", "chat"),
    ("mode=http,status=429", "chat"),
]
_SAME = ("ok", "status", "error_class", "error", "output_tokens", "tokens_source", "replica",
         "text_len", "time_source")  # fmt: skip


def _records(url: str, path: str, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    monkeypatch.setenv(chunkpath.ENV, path)
    out = []
    for mode, api in MODES:
        spec = LoadSpec(url=f"{url}/{mode}", api=api, transport="raw")

        async def go(spec: LoadSpec = spec) -> dict[str, Any]:
            async with make_session(spec) as s:
                body = json.dumps(build_body(spec, random.Random(0))).encode()
                return await send_attempt(s, spec, body, "cp-1", 1, None)

        with asyncio.Runner() as runner:
            out.append(runner.run(go()))
    return out


@pytest.mark.skipif(not COMPILED, reason=f"compiled chunk path not built: {WHY_NOT}")
def test_raw_records_same_on_both_paths(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    pure = _records(server.url, "python", monkeypatch)
    fast = _records(server.url, "compiled", monkeypatch)
    for (mode, _), p, f in zip(MODES, pure, fast, strict=True):
        assert p["chunk_path"] == "python" and f["chunk_path"] == "compiled"
        assert {k: p[k] for k in _SAME} == {k: f[k] for k in _SAME}, mode
        assert len(p["chunk_times"]) == len(f["chunk_times"]), mode
    by_mode = {m: r for (m, _), r in zip(MODES, fast, strict=True)}
    assert by_mode["mode=ok,tokens=6,text=cjk,split=7"]["ok"]
    assert by_mode["mode=ok,tokens=6,text=cjk,split=7"]["output_tokens"] == 6
    assert by_mode["mode=garbled"]["error_class"] == "garbled"
    assert by_mode["mode=error,k=2"]["error_class"] == "stream_error"
    assert by_mode["mode=truncated"]["error_class"] == "truncated"
    assert by_mode["mode=http,status=429"]["error_class"] == "http_429"
