"""The raw transport's connections: :class:`RawSession` (keep-alive pools, pre-built request
heads, kernel-time bookkeeping) and :class:`RawConnection` (one connection's asyncio ``Protocol``:
the ``httptools`` parser, the SSE parser fed as the bytes arrive, the kernel-stamped reads).

Split out of :mod:`chaoslib_infer.load.rawhttp` (its docstring describes the transport), which
keeps the attempt (``send_attempt_raw``) and re-exports :class:`RawSession` (import path kept).
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import socket
import ssl
import time
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

from chaoslib_infer.measure import chunkpath
from chaoslib_infer.measure.sse import StreamParser
from chaoslib_infer.safety.redact import clip

from . import kerneltime
from .attempts import (
    AttemptSpec,
    Deadline,
    chunk_deadline,
)

__all__ = ["RawConnection", "RawSession"]

_UNSAFE_URL = re.compile(r"[\x00-\x20\x7f]")  # controls and spaces: never in a request line


_USER_AGENT = "chaoslib-infer"
_Key = tuple[str, str, int]
_READ_SIZE = (
    64 * 1024
)  # one recvmsg a wake-up, under glibc's mmap threshold (256 KB: an mmap a read)


class RawSession:
    """Keep-alive connection pools (one per ``(scheme, host, port)``) and pre-built request heads.

    Use as an async context manager inside a running loop; leaving it closes every connection.

    Args:
        spec: the load spec (``headers``, ``connect_timeout_s``).
        ssl_context: context for ``https`` URLs; default ``ssl.create_default_context()``
            (certificates verified against the system store, like aiohttp's default).

    Kernel times (:mod:`chaoslib_infer.load.rawhttp` docstring) follow ``CHAOS_INFER_KERNEL_TIMESTAMPS`` as read here
    (``kerneltime.mode``); :meth:`timing_summary` gives the run's client lag.

    The stream parser class is chosen here, once (``measure.chunkpath``: the compiled chunk
    path when built, unless ``CHAOS_INFER_CHUNK_PATH`` says otherwise): :attr:`parser_cls`.

    Raises:
        ValueError: a header name or value in ``spec.headers`` holds CR, LF or NUL, or a header
            name is empty or holds ``:``; ``CHAOS_INFER_KERNEL_TIMESTAMPS`` is not on/rx/off;
            ``CHAOS_INFER_CHUNK_PATH`` is not auto/python/compiled, or compiled and not built.
    """

    def __init__(self, spec: AttemptSpec, ssl_context: ssl.SSLContext | None = None) -> None:
        self.spec = spec
        #: ``"on"`` (receive and transmit stamps), ``"rx"`` or ``"off"``
        self.kernel_mode = kerneltime.mode()
        #: the stream parser of every attempt (``measure.chunkpath.parser_class``)
        self.parser_cls: type[StreamParser] = chunkpath.parser_class()
        #: the compiled reads of kernel-stamped sockets (``chunkpath.compiled_reads``), or None
        self.fast_reads = chunkpath.compiled_reads()
        #: loop lag of every read that delivered output chunks on a kernel-stamped connection
        self.lag = kerneltime.LagStats()
        #: attempts recorded with ``time_source`` "kernel" / "loop"
        self.kernel_attempts = 0
        self.loop_attempts = 0
        self._ssl = ssl_context
        self._idle: dict[_Key, list[RawConnection]] = {}
        self._all: set[RawConnection] = set()
        self._heads: dict[str, tuple[_Key, bytes]] = {}
        self.closed = False
        #: connections opened so far (a keep-alive reuse opens none)
        self.connections_made = 0
        for k, v in spec.headers.items():
            if not k or any(c in k for c in "\r\n\0:") or any(c in str(v) for c in "\r\n\0"):
                raise ValueError(f"invalid HTTP header {k!r}: {v!r}")

    async def __aenter__(self) -> RawSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every connection (idle or busy) and forget the pools."""
        self.closed = True
        for conn in list(self._all):
            conn.abort()
        self._all.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run connection_lost

    def head(self, url: str) -> tuple[_Key, bytes]:
        """``(pool key, request bytes up to the X-Request-Id value)`` for ``url`` (cached).

        Raises:
            ValueError: a control character or whitespace in ``url`` (CR/LF would let it start
                a second header or request; header values are checked in ``__init__``).
        """
        got = self._heads.get(url)
        if got is not None:
            return got
        bad = _UNSAFE_URL.search(url)
        if bad:
            raise ValueError(f"URL {url!r}: control character {bad.group()!r}; refusing it")
        parts = urlsplit(url)
        scheme = parts.scheme
        host = parts.hostname or ""
        default = 443 if scheme == "https" else 80
        port = parts.port or default
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host_hdr = host if ":" not in host else f"[{host}]"
        if port != default:
            host_hdr += f":{port}"
        headers = {
            "host": ("Host", host_hdr),
            "user-agent": ("User-Agent", _USER_AGENT),
            "accept": ("Accept", "text/event-stream"),
            "content-type": ("Content-Type", "application/json"),
        }
        for k, v in self.spec.headers.items():
            if k.lower() not in ("x-request-id", "content-length", "transfer-encoding"):
                headers[k.lower()] = (k, str(v))
        lines = [f"POST {target} HTTP/1.1"] + [f"{k}: {v}" for k, v in headers.values()]
        prefix = ("\r\n".join(lines) + "\r\nX-Request-Id: ").encode("latin-1")
        got = ((scheme, host, port), prefix)
        self._heads[url] = got
        return got

    async def acquire(self, key: _Key) -> RawConnection:
        """An idle live connection to ``key``, else a new one (``connect_timeout_s`` applies).

        Raises:
            TimeoutError: the connect (with TLS handshake) took over ``spec.connect_timeout_s``.
            OSError: refused, unreachable, DNS or TLS failure.
        """
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        if self.closed:
            raise ConnectionError("session closed")
        scheme, host, port = key
        ctx: ssl.SSLContext | None = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            ctx = self._ssl
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.spec.connect_timeout_s):
            _, conn = await loop.create_connection(
                lambda: RawConnection(self, key),
                host,
                port,
                ssl=ctx,
                server_hostname=host if ctx else None,
            )
        self._all.add(conn)
        self.connections_made += 1
        if ctx is None and self.kernel_mode != "off":
            conn.take_over(loop, tx=self.kernel_mode == "on")
        return conn

    def timing_summary(self) -> dict[str, Any]:
        """The run's clock figures, for the load summary.

        Returns:
            ``time_source`` (``"kernel"`` when every attempt record is kernel-timed, ``"loop"``
            when none is, else ``"mixed"``), ``kernel_attempts``, ``loop_attempts``, and
            ``p50_client_lag_s``, ``p99_client_lag_s``, ``max_client_lag_s`` (seconds, None
            without a stamped read) and ``client_lag_reads`` (``kerneltime.LagStats.summary``).
        """
        k, lp = self.kernel_attempts, self.loop_attempts
        source = "kernel" if k and not lp else ("mixed" if k else "loop")
        return {
            "time_source": source,
            "kernel_attempts": k,
            "loop_attempts": lp,
            **self.lag.summary(),
        }

    def release(self, conn: RawConnection) -> None:
        """Return a connection whose reply was complete to its pool, or close it."""
        if conn.closed or self.closed or not conn.keep_alive:
            conn.abort()
            return
        conn.reset()
        self._idle.setdefault(conn.key, []).append(conn)

    def forget(self, conn: RawConnection) -> None:
        """Drop a closed connection from the pools."""
        self._all.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)


class RawConnection(asyncio.Protocol):
    """One HTTP/1.1 connection; holds the state of the attempt it carries (one at a time)."""

    def __init__(self, session: RawSession, key: _Key) -> None:
        self.session = session
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.waiter: asyncio.Future[str | None] | None = None
        self.now = 0.0
        self.now_loop = 0.0
        #: the socket this connection is read and written through (kernel times), else None
        self.sock: socket.socket | None = None
        self.poller: kerneltime.Poller | None = None
        #: reading was taken over (kernel receive stamps switched on); stays True once set
        self.stamped = False
        self.tx_stamps = False
        #: bytes written through ``sock`` since stamps were switched on (transmit stamp IDs)
        self.tx_bytes = 0
        #: attempts carried so far (0: the next one opened the connection)
        self.requests = 0
        self.reset()

    def reset(self) -> None:
        """Clear the per-attempt state (the connection is idle)."""
        self.waiter = None
        self.sp: StreamParser | None = None
        self.deadline: Deadline | None = None
        self.status: int | None = None
        self.replica: str | None = None
        self.lab_server: str | None = None
        self.retry_after: bytes | None = None  # the answer's Retry-After header, as sent
        self.encoding: bytes | None = None
        self.framed = False
        self.headers_done = False
        self.msg_done = False
        self.first_byte: float | None = None
        self.first_token: float | None = None
        self.done_at: float | None = None
        self.chunk_times: list[float] = []
        # loop handling times of the same events (kernel-stamped connections)
        self.first_byte_loop: float | None = None
        self.first_token_loop: float | None = None
        self.done_at_loop: float | None = None
        self.chunk_times_loop: list[float] = []
        #: every read of this attempt so far had a kernel stamp
        self.kernel_ok = True
        #: no stamp of this attempt may be earlier (its send time, then the previous read)
        self.floor = 0.0
        self.err_body: bytearray | None = None
        self.pending: list[bytes] = []
        self.keep_alive = False
        self.kind = "total"
        self.total_dl = math.inf
        self.idle: float | None = None
        self.grace = 0.5

    # ---- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.now = self.now_loop = time.perf_counter()
        self.kernel_ok = False  # the loop's transport read these bytes: no stamp
        self._feed(data)

    # ---- kernel-stamped reading (:mod:`chaoslib_infer.load.rawhttp` docstring)
    def take_over(self, loop: asyncio.AbstractEventLoop, tx: bool) -> bool:
        """Read (and write) this plain-TCP connection through a ``dup`` of its socket with
        kernel stamps; the loop's transport stops reading. Call before the first write.

        Returns:
            True when taken over; False (nothing changed: loop times) when the socket is not
            reachable or the kernel gives no receive stamps.
        """
        tr = self.transport
        raw = tr.get_extra_info("socket") if tr is not None else None
        if tr is None or raw is None:
            return False
        try:
            dup = socket.socket(fileno=os.dup(raw.fileno()))
        except (OSError, ValueError):
            return False
        rx, txs = kerneltime.enable(dup, tx)
        try:
            if not rx:
                raise OSError("no receive stamps")
            poller = kerneltime.poller_for(loop)
            dup.setblocking(False)
            poller.add(dup.fileno(), self._readable)
        except OSError:
            dup.close()
            return False
        tr.pause_reading()
        self.sock, self.poller, self.stamped, self.tx_stamps = dup, poller, True, txs
        return True

    def _readable(self) -> None:
        sock = self.sock
        if sock is not None:
            self._read(sock, _READ_SIZE)

    def _read(self, sock: socket.socket, size: int) -> bool:
        """One kernel-stamped read of up to ``size`` bytes (``kerneltime.recv_stamped``, or its
        compiled twin: :attr:`RawSession.fast_reads`), fed to the parser; False when nothing was
        read (or the connection ended)."""
        fast = self.session.fast_reads
        try:
            if fast is not None:
                got = fast.recv_stamped(sock.fileno(), size, self.floor)
            else:
                got = kerneltime.recv_stamped(sock, size, self.floor)
        except OSError as exc:
            self._reader_lost(exc)
            return False
        if got is None:
            if self.tx_stamps:  # an error-queue wake-up: a transmit stamp nobody read yet
                kerneltime.tx_stamp(sock)
            return False
        data, t, now, stamped = got
        if not data:
            self._reader_lost(None)
            return False
        if not stamped:
            self.kernel_ok = False
        self.floor = t
        self.now, self.now_loop = t, now
        self._feed(data)
        return True

    def send(self, data: bytes) -> tuple[float, float, str]:
        """Write ``data`` (the whole request).

        Returns:
            ``(sent, sent_loop, source)``: ``time.perf_counter`` seconds of the kernel's transmit
            stamp of the last byte (``source`` ``"tx_timestamp"``), else of the moment ``send``
            returned (``"send_return"``; both times equal), or of the handover to the loop's
            transport (``"loop"``: not taken over, or bytes still queued there).

        Raises:
            OSError: the socket refused the bytes (reset, broken pipe).
        """
        tr = self.transport
        assert tr is not None
        sock = self.sock
        if sock is None or tr.get_write_buffer_size():
            tr.write(data)
            now = time.perf_counter()
            return now, now, "loop"
        try:
            n = sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        self.tx_bytes += n
        if n < len(data):
            tr.write(data[n:])  # the rest after the loop's next turn: its time is unknown
            now = time.perf_counter()
            return now, now, "loop"
        now = time.perf_counter()
        if self.tx_stamps:
            stamp = kerneltime.tx_stamp(sock, self.tx_bytes - 1)
            if stamp is not None:
                later, wall = time.perf_counter(), time.time()  # read together
                t = later - (wall - stamp)
                return (t if t < now else now), now, "tx_timestamp"
        return now, now, "send_return"

    def _reader_lost(self, exc: Exception | None) -> None:
        """EOF or an error on the taken-over socket: end like the transport would."""
        self.connection_lost(exc)
        if self.transport is not None:
            if exc is None:
                self.transport.close()
            else:
                self.transport.abort()

    def _drop_reader(self) -> None:
        sock, self.sock = self.sock, None
        if sock is None:
            return
        if self.poller is not None:
            self.poller.remove(sock.fileno())
        sock.close()

    def _feed(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self.abort()  # bytes nobody asked for (or after the attempt ended): unusable
            return
        try:
            self.parser.feed_data(data)
            if self.pending:
                self._flush()
        except httptools.HttpParserUpgrade:
            self._finish("garbled:unexpected protocol upgrade")
        except httptools.HttpParserError as exc:
            if self.pending:  # the body before the broken bytes still counts ([DONE] seen?)
                self._flush()
            self._finish(clip(f"garbled:{type(exc).__name__}: {exc}", 300))

    def eof_received(self) -> bool | None:
        return None  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._drop_reader()
        self.closed = True
        self.session.forget(self)
        w = self.waiter
        if w is None or w.done():
            return
        if self.headers_done and not self.framed and exc is None and self.status is not None:
            self.msg_done = True  # read-until-close body: EOF ends the message
            w.set_result(None)
        elif exc is None:
            w.set_result(
                "reset:ServerDisconnected: connection closed before the reply was complete"
            )
        else:
            w.set_result(clip(f"reset:{type(exc).__name__}: {exc}", 300))

    # ---- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        n = name.lower()
        if n == b"x-replica-id":
            self.replica = value.decode("latin-1")
        elif n == b"x-lab-server":
            self.lab_server = value.decode("latin-1")
        elif n == b"retry-after":
            self.retry_after = value
        elif n in (b"content-length", b"transfer-encoding"):
            self.framed = True
        elif n == b"content-encoding":
            self.encoding = value.strip().lower()

    def on_headers_complete(self) -> None:
        self.headers_done = True
        self.first_byte = self.now
        self.first_byte_loop = self.now_loop
        status = self.status = self.parser.get_status_code()
        if self.encoding not in (None, b"identity"):
            self._finish(f"garbled:unrequested Content-Encoding {self.encoding.decode('latin-1')}")
        elif not 200 <= status < 300:
            self.err_body = bytearray()

    def on_body(self, body: bytes) -> None:
        if self.err_body is not None:
            self.err_body += body
            self._finish(None)  # like aiohttp's content.read(n): the first piece is enough
            return
        self.pending.append(body)  # parsed once per read (``_flush``): all share its timestamp

    def _flush(self) -> None:
        pending = self.pending
        body = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        sp = self.sp
        if sp is None:
            return
        n = sp.feed(body)
        if n:
            now = self.now
            if self.first_token is None:
                self.first_token = now
                self.first_token_loop = self.now_loop
            self.chunk_times.extend([now] * n)
            if self.stamped:
                self.chunk_times_loop.extend([self.now_loop] * n)
                if self.kernel_ok:
                    self.session.lag.add(self.now_loop - now)
            if self.deadline is not None:
                moved = chunk_deadline(self.kind, now, self.idle, self.total_dl)
                if moved is not None:
                    self.kind, dl = moved
                    self.deadline.move(dl)
        if sp.done and self.done_at is None:
            self.done_at = self.now
            self.done_at_loop = self.now_loop
            self.kind = "done"
            if self.deadline is not None:
                self.deadline.move(min(self.now + self.grace, self.total_dl))

    def on_message_complete(self) -> None:
        if self.pending:
            self._flush()
        self.msg_done = True
        self.keep_alive = self.parser.should_keep_alive()  # llhttp forgets it after the message
        self._finish(None)

    # ----
    def _finish(self, outcome: str | None) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(outcome)
        if outcome is not None:
            self.abort()

    def abort(self) -> None:
        """Close the connection at once (RST); it is never reused."""
        self._drop_reader()
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
