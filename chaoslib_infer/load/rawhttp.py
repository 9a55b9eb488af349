"""Raw HTTP/1.1 transport of the load client: asyncio ``Protocol`` + ``httptools`` (opt-in).

``LoadSpec(transport="raw")`` makes ``client.make_session`` return a ``RawSession`` and
``client.send_attempt`` hand each attempt to ``send_attempt_raw`` here. It does what the aiohttp
path does for an OpenAI-compatible streaming endpoint, with less work per request and per chunk:

* A keep-alive connection pool per ``(scheme, host, port)`` (unbounded: the run caps
  concurrency), connections made with ``loop.create_connection`` (TLS through an ``ssl`` context
  for ``https``: the default, certificate-verifying context unless one is given).
* Request bytes built once per URL up to the ``X-Request-Id`` value; per attempt only the id,
  ``Content-Length`` and body are appended: one ``transport.write``.
* The response parsed by ``httptools`` (llhttp, the parser of Node.js and uvicorn) in
  ``data_received``: status line, headers, ``Transfer-Encoding: chunked``, ``Content-Length`` or
  read-until-close. The body goes straight to ``sse.StreamParser`` inside the callback, with the
  ``time.perf_counter`` taken when the bytes arrived (``data_received``), so the attempt's task only
  wakes once, at the end; the per-chunk deadline bookkeeping of ``client.send_attempt`` runs in the
  callback too.
* **Kernel times** (plain ``http``; ``kerneltime`` module): once a connection is made, its reading
  is taken over from the loop's transport: the socket is read with ``recvmsg`` (a ``dup`` of its
  descriptor, ``loop.add_reader``) and each read carries the kernel's software receive stamp of
  its last segment (watched through the loop's ``kerneltime.Poller``), so a chunk's time is when its bytes reached the socket, not when the event loop
  got round to them. The request is written with ``send`` on the same socket and its send time is
  the kernel's software transmit stamp of its last byte (read from the error queue at once; on
  loopback it is there when ``send`` returns), else the time just after ``send`` returned; on a
  new connection the send time stays the moment the attempt started (before the connect), so a
  slow connect is in TTFT and E2E and never in the schedule lag. Such records say
  ``time_source: "kernel"`` and keep the loop's handling times beside the kernel ones
  (``*_loop`` fields, contracts.md section 3); the loop lag of every read that delivered output
  chunks goes to ``RawSession.lag`` (the run's ``p99_client_lag_s``). Where the platform gives no
  stamps (not Linux, the options refused, a read without one), over TLS, or with
  ``CHAOS_INFER_KERNEL_TIMESTAMPS=off``, times are the loop's (``time_source: "loop"``).

Error classes are those of the aiohttp path (``client`` module docstring, contracts.md section 3):
``connect`` (refused, unreachable, DNS, TLS handshake), ``timeout_connect`` (TCP + TLS connect over
``connect_timeout_s``), the three timeouts from the same ``attempts`` bookkeeping (``attempts.Deadline``),
``http_*`` from the status, ``reset`` (closed or reset after the connection was made, before the
reply was complete, including a pooled keep-alive connection the server closed as the request went
out: like the aiohttp path with its resend switched off, nothing is resent), ``garbled`` for a
response ``httptools`` rejects (or a ``Content-Encoding`` this client did not ask for), and the
stream classes from ``StreamParser.classify``. No redirects are followed (a 3xx is ``http_4xx``),
no proxy is used, nothing is decompressed (no ``Accept-Encoding`` is sent).
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

from chaoslib_infer.safety.redact import clip

from . import kerneltime
from .attempts import (
    AFTER_DONE_GRACE_S,
    AttemptSpec,
    Deadline,
    chunk_deadline,
    exc_msg,
    finish_attempt,
    first_deadline,
    http_error,
)
from .records import perf_to_unix
from .sse import StreamParser

_UNSAFE_URL = re.compile(r"[\x00-\x20\x7f]")  # controls and spaces: never in a request line


__all__ = ["RawSession", "send_attempt_raw"]

_USER_AGENT = "chaoslib-infer"
_Key = tuple[str, str, int]
_perf, _wall = time.perf_counter, time.time
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

    Kernel times (module docstring) follow ``CHAOS_INFER_KERNEL_TIMESTAMPS`` as read here
    (``kerneltime.mode``); :meth:`timing_summary` gives the run's client lag.

    Raises:
        ValueError: a header name or value in ``spec.headers`` holds CR, LF or NUL, or a header
            name is empty or holds ``:``; ``CHAOS_INFER_KERNEL_TIMESTAMPS`` is not on/rx/off.
    """

    def __init__(self, spec: AttemptSpec, ssl_context: ssl.SSLContext | None = None) -> None:
        self.spec = spec
        #: ``"on"`` (receive and transmit stamps), ``"rx"`` or ``"off"``
        self.kernel_mode = kerneltime.mode()
        #: loop lag of every read that delivered output chunks on a kernel-stamped connection
        self.lag = kerneltime.LagStats()
        #: attempts recorded with ``time_source`` "kernel" / "loop"
        self.kernel_attempts = 0
        self.loop_attempts = 0
        self._ssl = ssl_context
        self._idle: dict[_Key, list[_Conn]] = {}
        self._all: set[_Conn] = set()
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

    async def acquire(self, key: _Key) -> _Conn:
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
                lambda: _Conn(self, key), host, port, ssl=ctx, server_hostname=host if ctx else None
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

    def release(self, conn: _Conn) -> None:
        """Return a connection whose reply was complete to its pool, or close it."""
        if conn.closed or self.closed or not conn.keep_alive:
            conn.abort()
            return
        conn.reset()
        self._idle.setdefault(conn.key, []).append(conn)

    def forget(self, conn: _Conn) -> None:
        """Drop a closed connection from the pools."""
        self._all.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)


class _Conn(asyncio.Protocol):
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

    # ---- kernel-stamped reading (module docstring)
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
        """One ``recvmsg`` of up to ``size`` bytes, stamped and fed to the parser; False when
        nothing was read (or the connection ended)."""
        try:
            data, anc, _, _ = sock.recvmsg(size, kerneltime.ANC_SIZE)
        except (BlockingIOError, InterruptedError):
            if self.tx_stamps:  # an error-queue wake-up: a transmit stamp nobody read yet
                kerneltime.tx_stamp(sock)
            return False
        except OSError as exc:
            self._reader_lost(exc)
            return False
        if not data:
            self._reader_lost(None)
            return False
        now, wall = _perf(), _wall()  # read together: the stamp's offset
        stamp = kerneltime.rx_stamp(anc)
        if stamp is None:
            self.kernel_ok = False
            t = now
        else:
            t = now - (wall - stamp) if wall > stamp else now
            if t < self.floor:
                t = self.floor
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


async def send_attempt_raw(
    session: RawSession,
    spec: AttemptSpec,
    body: bytes,
    request_id: str,
    attempt: int,
    intended_at: float | None,
    url: str,
) -> dict[str, Any]:
    """``client.send_attempt`` over a ``RawSession``: same arguments, all given (``url``: the
    endpoint URL, ``endpoint_url(spec)`` unless the caller names one), same record, same error
    classes (module docstring); ``asyncio.CancelledError`` propagates and produces no record.

    On a kernel-stamped connection the record's times are the kernel's (``time_source``
    ``"kernel"``, module docstring) with the loop's beside them: ``sent_source``
    (``"tx_timestamp"``, ``"send_return"``, ``"connect"``: a new connection, timed from the
    attempt's start; ``"loop"``), ``sent_at_loop``, ``first_byte_at_loop``,
    ``first_token_at_loop``, ``chunk_times_loop`` (one per chunk time), ``end_at_loop``; every
    kernel time is <= its loop time and the kernel times are non-decreasing. Otherwise
    ``time_source`` is ``"loop"``.
    """
    loop = asyncio.get_running_loop()
    pc = time.perf_counter
    key, prefix = session.head(url)
    status: int | None = None
    replica: str | None = None
    err_class: str | None = None
    err: str | None = None
    after_done = False
    conn: _Conn | None = None
    clean = False
    first_byte: float | None = None
    first_token: float | None = None
    done_at: float | None = None
    chunk_times: list[float] = []
    sp = StreamParser()
    kernel = False
    sent_source = "connect"
    loop_times: tuple[float | None, float | None, float | None, list[float], float] | None = None

    sent = pc()  # the attempt starts: deadlines run from here, and a new connection's send time
    sent_loop = sent
    total_dl, kind, dl = first_deadline(spec, sent)

    deadline = Deadline(loop, dl)
    timed_out = False
    expired = False
    try:
        try:
            try:
                conn = await session.acquire(key)
            except TimeoutError as exc:
                err_class, err = (
                    "timeout_connect",
                    f"connect not done within {spec.connect_timeout_s} s{_why(exc)}",
                )
            except OSError as exc:
                err_class, err = "connect", exc_msg(exc)
            if conn is not None:
                conn.sp = sp
                conn.deadline = deadline
                conn.kind = kind
                conn.total_dl = total_dl
                conn.idle = spec.idle_timeout_s
                conn.grace = AFTER_DONE_GRACE_S
                waiter = conn.waiter = loop.create_future()
                fresh = conn.requests == 0
                conn.requests += 1
                try:
                    t_k, t_l, how = conn.send(
                        b"".join(
                            (
                                prefix,
                                request_id.encode("latin-1"),
                                b"\r\nContent-Length: %d\r\n\r\n" % len(body),
                                body,
                            )
                        )
                    )
                except OSError as exc:  # the server closed the pooled connection: a reset
                    conn.connection_lost(exc)
                else:
                    conn.floor = t_k
                    if not fresh:
                        sent, sent_loop, sent_source = t_k, t_l, how
                outcome = await waiter
                if outcome is not None:
                    err_class, _, err = outcome.partition(":")
                    if err_class == "garbled":
                        if conn.headers_done and conn.encoding in (None, b"identity"):
                            err_class = "reset"  # a broken body, as aiohttp's ClientPayloadError
                        else:
                            err = "invalid HTTP response: " + err
                    after_done = conn.done_at is not None
                elif conn.err_body is not None:
                    text = bytes(conn.err_body).decode("utf-8", "replace")
                    err_class, err = http_error(conn.status or 0, text)  # scrubbed, then cut
                    clean = conn.msg_done
                else:
                    clean = conn.msg_done
                    sp.close()
                    err_class, err = sp.classify()
        finally:
            expired = deadline.close()
            if conn is not None:
                kind = conn.kind
                status, replica = conn.status, conn.replica or conn.lab_server
                first_byte, first_token = conn.first_byte, conn.first_token
                chunk_times, done_at = conn.chunk_times, conn.done_at
                if conn.stamped:
                    lt = (conn.first_byte_loop, conn.first_token_loop, conn.done_at_loop,
                          conn.chunk_times_loop, conn.now_loop)  # fmt: skip
                    if conn.kernel_ok:
                        kernel, loop_times = True, lt
                    else:  # a read without a stamp: the whole record on the loop's clock
                        first_byte, first_token, done_at, chunk_times = lt[:4]
                        sent = sent_loop
                conn.deadline = None
                if clean:
                    session.release(conn)  # resets the connection's attempt state
                else:
                    conn.abort()
    except asyncio.CancelledError:
        if not expired:
            raise  # cancelled by the caller, not by our deadline: no record
        timed_out = True
    end = pc()
    rec = finish_attempt(
        spec,
        sp,
        request_id=request_id,
        attempt=attempt,
        intended_at=intended_at,
        sent=sent,
        end=end,
        status=status,
        replica=replica,
        err_class=err_class,
        err=err,
        timed_out=timed_out,
        kind=kind,
        after_done=after_done,
        done_at=done_at,
        first_byte=first_byte,
        first_token=first_token,
        chunk_times=chunk_times,
    )
    if kernel and loop_times is not None:
        session.kernel_attempts += 1
        fb_l, ft_l, done_l, ct_l, _ = loop_times
        rec["time_source"] = "kernel"
        rec["sent_source"] = sent_source
        rec["sent_at_loop"] = perf_to_unix(sent_loop)
        rec["first_byte_at_loop"] = None if fb_l is None else perf_to_unix(fb_l)
        rec["first_token_at_loop"] = None if ft_l is None else perf_to_unix(ft_l)
        rec["chunk_times_loop"] = [perf_to_unix(t) for t in ct_l]
        rec["end_at_loop"] = perf_to_unix(
            done_l if done_at is not None and done_l is not None and rec["ok"] else end
        )
    else:
        session.loop_attempts += 1
        rec["time_source"] = "loop"
    return rec


def _why(exc: BaseException) -> str:
    text = str(exc)
    return f" ({type(exc).__name__}: {text})" if text else ""
