"""The compiled kernel-stamped read (issue 24, ``measure._recvfast``) against its pure reference
(``load.kerneltime.recv_stamped``) on real loopback sockets, and the compiled ``Poller`` turn.

Both reads are run on the same kinds of reads: nothing queued, stamped bytes, an unstamped
socket, the floor, EOF, a reset, a read larger than the buffer; stamps of the two paths taken
``GAP_S`` apart on one connection must be ``GAP_S`` apart (one clock), and each must lie between
the send and the read.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from chaoslib_infer.load import kerneltime
from chaoslib_infer.measure import chunkpath

COMPILED, WHY_NOT = chunkpath.compiled_available()
pytestmark = pytest.mark.skipif(not COMPILED, reason=f"compiled chunk path not built: {WHY_NOT}")
GAP_S = 0.05


def _fast() -> Any:
    mod = chunkpath.compiled_reads()
    if mod is None:
        pytest.skip(f"{chunkpath.ENV}={os.environ.get(chunkpath.ENV)!r} chooses the pure path")
    return mod


def _reads() -> list[tuple[str, Callable[[socket.socket, int, float], Any]]]:
    fast = _fast()
    return [
        ("python", kerneltime.recv_stamped),
        ("compiled", lambda s, n, floor: fast.recv_stamped(s.fileno(), n, floor)),
    ]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """``(client, server)``: a loopback TCP connection, the client non-blocking."""
    with socket.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen()
        cli = socket.create_connection(lst.getsockname())
        srv, _ = lst.accept()
    cli.setblocking(False)
    srv.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        yield cli, srv
    finally:
        cli.close()
        srv.close()


def _wait_readable(sock: socket.socket) -> None:
    assert select.select([sock], [], [], 5)[0], "nothing arrived within 5 s"


def _stamped(cli: socket.socket) -> None:
    assert kerneltime.enable(cli, tx=False)[0]
    assert kerneltime.hold_stamps()


@pytest.mark.parametrize("name", ["python", "compiled"])
def test_nothing_queued_reads_none(pair: tuple[socket.socket, socket.socket], name: str) -> None:
    read = dict(_reads())[name]
    assert read(pair[0], 4096, 0.0) is None


@pytest.mark.parametrize("name", ["python", "compiled"])
def test_stamped_read(pair: tuple[socket.socket, socket.socket], name: str) -> None:
    cli, srv = pair
    _stamped(cli)
    read = dict(_reads())[name]
    sent = time.perf_counter()
    srv.sendall(b"data: hello\n\n")
    _wait_readable(cli)
    time.sleep(0.02)  # the read comes late: its stamp must not move with it
    got = read(cli, 4096, 0.0)
    assert got is not None
    data, t, now, stamped = got
    assert data == b"data: hello\n\n" and stamped
    assert sent <= t <= sent + 0.015 < now, (sent, t, now)


def test_both_paths_one_clock(pair: tuple[socket.socket, socket.socket]) -> None:
    """Burst 1 read by the pure path, burst 2 (about ``GAP_S`` later) by the compiled one: the
    stamps are as far apart as the two sends (read on ``perf_counter`` just before each) within
    5 ms, so both convert into the same ``perf_counter`` clock. The sends' own gap is the truth,
    not ``GAP_S``: on a busy machine the sleep overruns (a fresh-clone run: 69.8 ms)."""
    cli, srv = pair
    _stamped(cli)
    (_, pure), (_, fast) = _reads()
    sent_one = time.perf_counter()
    srv.sendall(b"one")
    _wait_readable(cli)
    first = pure(cli, 4096, 0.0)
    time.sleep(GAP_S)
    sent_two = time.perf_counter()
    srv.sendall(b"two")
    _wait_readable(cli)
    second = fast(cli, 4096, 0.0)
    assert first is not None and second is not None
    assert first[0] == b"one" and second[0] == b"two" and first[3] and second[3]
    gap = sent_two - sent_one
    assert abs((second[1] - first[1]) - gap) < 0.005, (first, second, gap)


@pytest.mark.parametrize("name", ["python", "compiled"])
def test_floor_holds_a_stamp_back(pair: tuple[socket.socket, socket.socket], name: str) -> None:
    cli, srv = pair
    _stamped(cli)
    read = dict(_reads())[name]
    srv.sendall(b"x")
    _wait_readable(cli)
    floor = time.perf_counter() + 10.0
    got = read(cli, 4096, floor)
    assert got is not None and got[1] == floor and got[3]


@pytest.mark.parametrize("name", ["python", "compiled"])
def test_unstamped_socket(pair: tuple[socket.socket, socket.socket], name: str) -> None:
    cli, srv = pair
    read = dict(_reads())[name]
    srv.sendall(b"plain")
    _wait_readable(cli)
    got = read(cli, 4096, time.perf_counter() + 10.0)
    assert got is not None
    data, t, now, stamped = got
    assert data == b"plain" and not stamped and t == now  # no floor without a stamp


@pytest.mark.parametrize("name", ["python", "compiled"])
def test_eof(pair: tuple[socket.socket, socket.socket], name: str) -> None:
    cli, srv = pair
    _stamped(cli)
    read = dict(_reads())[name]
    srv.shutdown(socket.SHUT_WR)
    _wait_readable(cli)
    got = read(cli, 4096, 0.0)
    assert got is not None
    assert got[0] == b"" and got[1] == got[2] and not got[3]


@pytest.mark.parametrize("name", ["python", "compiled"])
def test_reset_raises_the_same_error(pair: tuple[socket.socket, socket.socket], name: str) -> None:
    cli, srv = pair
    read = dict(_reads())[name]
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    srv.close()  # RST
    _wait_readable(cli)
    with pytest.raises(ConnectionResetError, match=r"\[Errno 104\] Connection reset by peer"):
        read(cli, 4096, 0.0)


def test_compiled_read_caps_at_its_buffer(pair: tuple[socket.socket, socket.socket]) -> None:
    cli, srv = pair
    fast = _fast()
    srv.sendall(b"z" * 200_000)
    time.sleep(0.05)
    got, total = fast.recv_stamped(cli.fileno(), 1 << 20, 0.0), 0
    while got is not None:
        assert 0 < len(got[0]) <= 65536
        total += len(got[0])
        got = fast.recv_stamped(cli.fileno(), 1 << 20, 0.0)
        if got is None and total < 200_000:
            _wait_readable(cli)
            got = fast.recv_stamped(cli.fileno(), 1 << 20, 0.0)
    assert total == 200_000


def test_compiled_turn_calls_each_ready_handler() -> None:
    fast = _fast()
    ep = select.epoll()
    epfd = ep.fileno()
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    e, f = socket.socketpair()
    called: list[str] = []
    try:
        handlers = {a.fileno(): lambda: called.append("a"), c.fileno(): lambda: called.append("c")}
        for s in (a, c, e):  # e is watched but has no handler: skipped
            ep.register(s.fileno(), select.EPOLLIN)
        fast.dispatch(epfd, handlers)
        assert called == []  # nothing ready: nothing called, no wait
        b.send(b"1")
        d.send(b"2")
        f.send(b"3")
        fast.dispatch(epfd, handlers)
        assert sorted(called) == ["a", "c"]
    finally:
        ep.close()
        for s in (a, b, c, d, e, f):
            s.close()
    with pytest.raises(OSError):
        fast.dispatch(epfd, {})  # a closed set (or a reused number: not an epoll set)


def test_python_env_chooses_the_pure_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(chunkpath.ENV, "python")
    assert chunkpath.compiled_reads() is None
    monkeypatch.setenv(chunkpath.ENV, "compiled")
    assert chunkpath.compiled_reads() is not None
