"""Kernel socket timestamps: when bytes arrived on (or left) a socket, not when the loop saw them.

An event loop hands a coroutine or callback the bytes of a socket read only when it gets round to
that socket: under load, after every other ready callback of the same turn. A time taken then
(``time.perf_counter()`` in ``data_received``) carries that scheduling delay, which a load client
would report as the service's latency. Linux stamps every received segment in software as it
enters the stack (``SO_TIMESTAMPING`` with ``SOF_TIMESTAMPING_RX_SOFTWARE|SOFTWARE``, or
``SO_TIMESTAMPNS``) and hands the stamp of the last segment of each read to ``recvmsg`` as
ancillary data; with ``SOF_TIMESTAMPING_TX_SOFTWARE`` it also stamps the moment the last byte of a
``send`` went to the device (on loopback, inside the ``send`` call) and queues that stamp on the
socket's error queue. This module sets those options, reads the stamps, converts them to the
process's ``time.perf_counter`` clock, and keeps the **client lag** statistics (loop handling time
minus kernel time, per read).

Stamps are ``CLOCK_REALTIME``; a stamp is converted with the offset read at the moment it is
handled (``now_perf - (time.time() - stamp)``), so a wall-clock step between two reads moves only
that read, and the lag (``time.time() - stamp``) is clamped at 0: a converted stamp is never later
than the loop time it is kept beside.

``CHAOS_INFER_KERNEL_TIMESTAMPS`` chooses what is used: unset or ``on`` (receive and transmit
stamps), ``rx`` (receive stamps only; the send time is taken just
after ``send`` returned), ``off`` (no kernel stamps: loop time, as on a platform without them).
Linux only; elsewhere :func:`enable` reports no stamps and callers fall back to loop time.

Stamped sockets are watched through a :class:`Poller`, one ``epoll`` set per event loop that the
loop watches as a single descriptor, not with one ``loop.add_reader`` each: a transmit stamp
waiting on a socket's error queue makes that socket report ``EPOLLERR``, and libuv (uvloop) stops
watching a descriptor for good on ``EPOLLERR`` (its poll handle ends with ``UV_EBADF``), so a stamp
queued after ``send`` returned (a segment the kernel sent later, from softirq context) would leave
the connection unread. The inner set reports it to the socket's own handler, which drains the
queue; the ``epoll`` descriptor itself only ever reads as readable.

The kernel stamps received packets only while some socket on the machine has asked for stamps
(the ``netstamp_needed_key`` static key of ``net/core/dev.c``), and it switches that key on
*deferred*, from a work queue, when the first such socket asks: the first reads of the first
stamped socket come without a stamp (measured here: 194 of 200 one-read connections, each the
only stamped socket, read no stamp; with one other stamped socket open, 0 of 50), and the key
goes off again when the last stamped socket closes. :func:`hold_stamps` keeps one stamped UDP
loopback socket open for the life of the process, primed until it reads a stamp, so a run's
first connections (and every new connection after its pool emptied) are stamped too; the
:class:`Poller` calls it.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import struct
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from chaoslib_infer.measure import chunkpath

__all__ = [
    "ANC_SIZE",
    "ENV",
    "LagStats",
    "enable",
    "hold_stamps",
    "mode",
    "rx_stamp",
    "Poller",
    "poller_for",
    "recv_stamped",
    "session_summary",
    "tx_stamp",
]

#: Environment variable that chooses the stamps used (module docstring).
ENV = "CHAOS_INFER_KERNEL_TIMESTAMPS"

_LINUX = sys.platform.startswith("linux")
SO_TIMESTAMPNS: int = getattr(socket, "SO_TIMESTAMPNS", 35)  # SO_TIMESTAMPNS_OLD on Linux
SO_TIMESTAMPING: int = getattr(socket, "SO_TIMESTAMPING", 37)  # SO_TIMESTAMPING_OLD on Linux
SOF_TIMESTAMPING_TX_SOFTWARE = 1 << 1
SOF_TIMESTAMPING_RX_SOFTWARE = 1 << 3
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SOF_TIMESTAMPING_OPT_ID = 1 << 7
SOF_TIMESTAMPING_OPT_TSONLY = 1 << 11
_RX_FLAGS = SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE
_TX_FLAGS = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_OPT_ID | SOF_TIMESTAMPING_OPT_TSONLY
_TS = struct.Struct("@ll")  # struct timespec (the _OLD options: native long seconds, nanoseconds)
_TS_SIZE = _TS.size
_TS_UNPACK = _TS.unpack_from
_SOL_SOCKET = socket.SOL_SOCKET
_STAMP_KINDS = (SO_TIMESTAMPING, SO_TIMESTAMPNS)  # SCM_* share the SO_* numbers
#: ancillary buffer for one read: a ``scm_timestamping`` (3 timespecs) with room to spare
ANC_SIZE = socket.CMSG_SPACE(3 * _TS.size) + 64 if hasattr(socket, "CMSG_SPACE") else 0
_ERR_ANC = ANC_SIZE + 128  # the error queue adds a sock_extended_err (+ address)
#: ``struct sock_extended_err``: errno, origin, type, code, pad, info, data
_EE = struct.Struct("=IBBBBII")
_RECVERR = {(getattr(socket, "SOL_IP", 0), 11), (getattr(socket, "SOL_IPV6", 41), 25)}


def mode() -> str:
    """``"on"`` (rx and tx stamps), ``"rx"`` or ``"off"``, from :data:`ENV` (default ``on``).

    Raises:
        ValueError: :data:`ENV` holds anything else.
    """
    v = os.environ.get(ENV, "on").strip().lower()
    if v in ("", "on", "1", "true", "yes"):
        return "on"
    if v in ("off", "0", "false", "no", "loop"):
        return "off"
    if v == "rx":
        return "rx"
    raise ValueError(f"{ENV}={v!r}: expected on, rx or off")


_HOLDER: list[socket.socket] = []  # the stamped socket :func:`hold_stamps` keeps open


def hold_stamps(timeout_s: float = 0.2) -> bool:
    """Keep the kernel's receive stamping switched on for this process (module docstring).

    Opens (once per process) a UDP socket on 127.0.0.1 with receive stamps on and sends it
    datagrams until one reads with a stamp, or ``timeout_s`` seconds passed; the socket stays
    open (one descriptor) so the kernel's stamping key stays on while the process lives.

    Returns:
        True when a stamped read was seen (now or by an earlier call); False off Linux, without
        loopback UDP, or when no stamp came within ``timeout_s`` (readers then see unstamped
        reads and fall back to loop time, as stated in their records). Never raises.
    """
    if _HOLDER:
        return True
    if not _LINUX or not ANC_SIZE:
        return False
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        return False
    try:
        sock.bind(("127.0.0.1", 0))
        if not enable(sock, tx=False)[0]:
            raise OSError("no receive stamps")
        sock.settimeout(0.05)
        addr = sock.getsockname()
        deadline = time.monotonic() + timeout_s
        while True:
            sock.sendto(b"\0", addr)
            try:
                _, anc, _, _ = sock.recvmsg(1, ANC_SIZE)
            except TimeoutError:
                anc = []
            if rx_stamp(anc) is not None:
                _HOLDER.append(sock)
                return True
            if time.monotonic() >= deadline:
                raise OSError("no stamp yet")
            time.sleep(0.001)
    except OSError:
        sock.close()
        return False


class Poller:
    """An ``epoll`` set of stamped sockets, watched by ``loop`` as one descriptor (module
    docstring). Handlers run in the loop's thread, one call per ready socket per turn.

    Raises:
        OSError: no ``epoll`` here (not Linux); callers then use loop times.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._ep = select.epoll()
        hold_stamps()
        self._handlers: dict[int, Callable[[], None]] = {}
        self.closed = False
        fast = chunkpath.compiled_reads()  # the turn in C when the compiled path is chosen
        if fast is not None:
            epfd, handlers, turn = self._ep.fileno(), self._handlers, fast.dispatch
            loop.add_reader(epfd, lambda: turn(epfd, handlers))
        else:
            loop.add_reader(self._ep.fileno(), self._ready)

    def add(self, fd: int, handler: Callable[[], None]) -> None:
        """Call ``handler()`` whenever ``fd`` is readable (or has an error or stamp pending)."""
        if self.closed:
            raise OSError("poller closed")
        self._handlers[fd] = handler
        self._ep.register(fd, select.EPOLLIN)

    def remove(self, fd: int) -> None:
        """Stop watching ``fd`` (idempotent; call before closing it)."""
        if self._handlers.pop(fd, None) is not None and not self.closed:
            try:
                self._ep.unregister(fd)
            except (OSError, ValueError):
                pass

    def _ready(self) -> None:
        handlers = self._handlers
        for fd, _ in self._ep.poll(0, 512):
            h = handlers.get(fd)
            if h is not None:
                h()

    def close(self) -> None:
        """Stop watching everything and close the ``epoll`` descriptor (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self._handlers.clear()
        try:
            self._loop.remove_reader(self._ep.fileno())
        except (OSError, ValueError, RuntimeError):
            pass
        self._ep.close()


_POLLERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Poller] = weakref.WeakKeyDictionary()


def poller_for(loop: asyncio.AbstractEventLoop) -> Poller:
    """The loop's shared :class:`Poller` (made on first use; closed when the loop is collected).

    Raises:
        OSError: no ``epoll`` here.
    """
    p = _POLLERS.get(loop)
    if p is None or p.closed:
        p = _POLLERS[loop] = Poller(loop)
    return p


def enable(sock: socket.socket, tx: bool = True) -> tuple[bool, bool]:
    """Ask the kernel to stamp what ``sock`` (a connected TCP socket) receives (and sends).

    Tries ``SO_TIMESTAMPING`` (software receive stamps; with ``tx`` also software transmit stamps,
    ID'd, stamp only), then ``SO_TIMESTAMPNS`` (receive only).

    Returns:
        ``(rx, tx)``: whether receive and transmit stamps were switched on. ``(False, False)``
        off Linux or when the kernel refuses both options; never raises for that.
    """
    if not _LINUX or not ANC_SIZE:
        return False, False
    if tx:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _RX_FLAGS | _TX_FLAGS)
            return True, True
        except OSError:
            pass
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _RX_FLAGS)
        return True, False
    except OSError:
        pass
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return True, False
    except OSError:
        return False, False


def recv_stamped(
    sock: socket.socket, size: int, floor: float
) -> tuple[bytes, float, float, bool] | None:
    """One kernel-stamped read of ``sock`` (non-blocking, stamps on: :func:`enable`): the pure
    reference of the compiled ``_recvfast.recv_stamped`` (which takes the descriptor).

    Args:
        sock: the socket.
        size: most bytes to read (the compiled read caps it at 64 KiB).
        floor: ``time.perf_counter`` seconds no stamp of this read may be earlier than (the
            attempt's send time, then its previous read).

    Returns:
        None when there was nothing to read (``EAGAIN``, ``EINTR``: an error-queue wake-up);
        else ``(data, t, now, stamped)``: the bytes (``b""`` at EOF), their time ``t`` and the
        loop time ``now`` (``time.perf_counter`` seconds), and whether the kernel stamped them.
        Stamped: ``t = now - (time.time() - stamp)`` (the offset read at that moment; ``now``
        when the stamp is later than ``time.time()``), at least ``floor``. Unstamped (or EOF):
        ``t = now``.

    Raises:
        OSError: the read failed (reset, bad descriptor).
    """
    try:
        data, anc, _, _ = sock.recvmsg(size, ANC_SIZE)
    except (BlockingIOError, InterruptedError):
        return None
    now, wall = time.perf_counter(), time.time()  # read together: the stamp's offset
    if not data:
        return b"", now, now, False
    stamp = rx_stamp(anc)
    if stamp is None:
        return data, now, now, False
    t = now - (wall - stamp) if wall > stamp else now
    return data, (floor if t < floor else t), now, True


def rx_stamp(ancdata: Iterable[tuple[int, int, bytes]]) -> float | None:
    """The receive stamp in ``recvmsg`` ancillary data: unix seconds (``CLOCK_REALTIME``), the
    arrival of the last segment of that read; None when the data holds no (non-zero) stamp."""
    if ancdata.__class__ is list and len(ancdata) == 1:  # the usual case, without the loop
        level, kind, data = ancdata[0]
        if level == _SOL_SOCKET and kind in _STAMP_KINDS and len(data) >= _TS_SIZE:
            sec, nsec = _TS_UNPACK(data)
            if sec or nsec:
                return sec + nsec * 1e-9
            return None
    for level, kind, data in ancdata:
        if level != socket.SOL_SOCKET or len(data) < _TS.size:
            continue
        if kind == SO_TIMESTAMPING or kind == SO_TIMESTAMPNS:  # SCM_* share the SO_* numbers
            sec, nsec = _TS.unpack_from(data)  # ts[0]: the software stamp
            if sec or nsec:
                return sec + nsec * 1e-9
    return None


def tx_stamp(sock: socket.socket, key: int | None = None) -> float | None:
    """Drain ``sock``'s error queue of transmit stamps; the one for byte ``key``, unix seconds.

    Args:
        sock: a socket with transmit stamps on (:func:`enable`).
        key: the stamp's ID (``SOF_TIMESTAMPING_OPT_ID`` on TCP: bytes sent since :func:`enable`
            minus one, i.e. the last byte of the ``send`` wanted, modulo 2**32); None for the
            latest stamp whatever its ID. Stamps of other sends (a late one left by an earlier
            request) are drained and dropped.

    Returns:
        The stamp, or None when the queue holds none for ``key`` (yet). Never blocks
        (``MSG_DONTWAIT``); a platform without an error queue gives None.
    """
    found: float | None = None
    flags = getattr(socket, "MSG_ERRQUEUE", 0x2000) | getattr(socket, "MSG_DONTWAIT", 0x40)
    for _ in range(16):  # one stamp per send call; a request is one or a few sends
        try:
            _, anc, _, _ = sock.recvmsg(1, _ERR_ANC, flags)
        except OSError:  # BlockingIOError: empty
            break
        stamp = rx_stamp(anc)  # same cmsg layout (SCM_TIMESTAMPING, ts[0])
        if stamp is None:
            continue
        if key is None or _stamp_id(anc) == key % (1 << 32):
            found = stamp
    return found


def _stamp_id(ancdata: Iterable[tuple[int, int, bytes]]) -> int | None:
    """``ee_data`` of the ``sock_extended_err`` beside a transmit stamp (its OPT_ID key)."""
    for level, kind, data in ancdata:
        if (level, kind) in _RECVERR and len(data) >= _EE.size:
            return int(_EE.unpack_from(data)[6])
    return None


class LagStats:
    """Client lag of a run: per socket read, the loop's handling time minus the kernel's stamp.

    Constant memory (a bucket count per value): values are kept in microseconds, exact below
    1,024 us and with 10 significant bits above (relative error < 0.1 %, like the HDR histograms
    of ``measure.metrics``); the exact maximum is kept beside them.
    """

    __slots__ = ("_counts", "n", "max_s")

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        #: reads counted
        self.n = 0
        #: largest lag seen, seconds (0.0 before any)
        self.max_s = 0.0

    def add(self, lag_s: float) -> None:
        """Count one read's lag (seconds; a negative value counts as 0)."""
        if lag_s > self.max_s:
            self.max_s = lag_s
        us = int(lag_s * 1e6) if lag_s > 0 else 0
        if us >= 1024:
            shift = us.bit_length() - 10
            us = ((us >> shift) << shift) + (1 << shift) - 1  # the bucket's highest value
        c = self._counts
        c[us] = c.get(us, 0) + 1
        self.n += 1

    def percentile_s(self, pct: float) -> float | None:
        """The ``pct`` percentile (0-100) in seconds, None before any value."""
        if not self.n:
            return None
        rank = max(1, -(-self.n * pct // 100))  # ceil, at least the first value
        seen = 0
        for us in sorted(self._counts):
            seen += self._counts[us]
            if seen >= rank:
                return min(us / 1e6, self.max_s)
        return self.max_s

    def summary(self) -> dict[str, Any]:
        """``{"p50_client_lag_s", "p99_client_lag_s", "max_client_lag_s", "client_lag_reads"}``
        (seconds; None where no read was stamped)."""
        return {
            "p50_client_lag_s": self.percentile_s(50),
            "p99_client_lag_s": self.percentile_s(99),
            "max_client_lag_s": self.max_s if self.n else None,
            "client_lag_reads": self.n,
        }


def session_summary(session: object) -> dict[str, Any]:
    """The timing part of a load summary for ``session`` (a ``RawSession`` or an aiohttp one).

    Returns:
        ``RawSession.timing_summary()`` when the session has one, else ``time_source: "loop"``
        with every lag figure None (contracts.md section 3, "Load summary").
    """
    fn = getattr(session, "timing_summary", None)
    if callable(fn):
        got: Mapping[str, Any] = fn()
        return dict(got)
    return {
        "time_source": "loop",
        "kernel_attempts": 0,
        "loop_attempts": None,
        **LagStats().summary(),
    }
