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

Error classes are those of the aiohttp path (``client`` module docstring, contracts.md section 3):
``connect`` (refused, unreachable, DNS, TLS handshake), ``timeout_connect`` (TCP + TLS connect over
``connect_timeout_s``), the three timeouts from the same ``client._Deadline`` bookkeeping,
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
import re
import ssl
import time
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import httptools

from chaoslib_infer.safety.redact import clip

from .sse import StreamParser

if TYPE_CHECKING:
    from .client import LoadSpec, _Deadline

_UNSAFE_URL = re.compile(r"[\x00-\x20\x7f]")  # controls and spaces: never in a request line


__all__ = ["RawSession", "send_attempt_raw"]

_USER_AGENT = "chaoslib-infer"
_Key = tuple[str, str, int]


class RawSession:
    """Keep-alive connection pools (one per ``(scheme, host, port)``) and pre-built request heads.

    Use as an async context manager inside a running loop; leaving it closes every connection.

    Args:
        spec: the load spec (``headers``, ``connect_timeout_s``).
        ssl_context: context for ``https`` URLs; default ``ssl.create_default_context()``
            (certificates verified against the system store, like aiohttp's default).

    Raises:
        ValueError: a header name or value in ``spec.headers`` holds CR, LF or NUL, or a header
            name is empty or holds ``:``.
    """

    def __init__(self, spec: LoadSpec, ssl_context: ssl.SSLContext | None = None) -> None:
        self.spec = spec
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
        return conn

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
        self.reset()

    def reset(self) -> None:
        """Clear the per-attempt state (the connection is idle)."""
        self.waiter = None
        self.sp: StreamParser | None = None
        self.deadline: _Deadline | None = None
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
        if self.waiter is None or self.waiter.done():
            self.abort()  # bytes nobody asked for (or after the attempt ended): unusable
            return
        self.now = time.perf_counter()
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
            self.chunk_times.extend([now] * n)
            if self.deadline is not None:
                idle = self.idle
                if idle is not None:
                    new_dl = now + idle
                    if new_dl < self.total_dl:
                        self.kind = "idle"
                        self.deadline.move(new_dl)
                    else:
                        self.kind = "total"
                        self.deadline.move(self.total_dl)
                elif self.kind == "ttft":
                    self.kind = "total"
                    self.deadline.move(self.total_dl)
        if sp.done and self.done_at is None:
            self.done_at = self.now
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
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


async def send_attempt_raw(
    session: RawSession,
    spec: LoadSpec,
    body: bytes,
    request_id: str,
    attempt: int = 1,
    intended_at: float | None = None,
    url: str | None = None,
) -> dict[str, Any]:
    """``client.send_attempt`` over a ``RawSession``: same arguments, same record, same error
    classes (module docstring); ``asyncio.CancelledError`` propagates and produces no record."""
    from . import client as _c  # import cycle: client imports this module lazily

    loop = asyncio.get_running_loop()
    pc = time.perf_counter
    key, prefix = session.head(url or _c.endpoint_url(spec))
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

    sent = pc()
    attempt_timeout = spec.attempt_timeout
    total_dl = sent + attempt_timeout
    ttft_dl = sent + spec.ttft_timeout_s if spec.ttft_timeout_s is not None else math.inf
    if ttft_dl < total_dl:
        kind, dl = "ttft", ttft_dl
    else:
        kind, dl = "total", total_dl

    deadline = _c._Deadline(loop, dl)
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
                err_class, err = "connect", _c._exc_msg(exc)
            if conn is not None:
                conn.sp = sp
                conn.deadline = deadline
                conn.kind = kind
                conn.total_dl = total_dl
                conn.idle = spec.idle_timeout_s
                conn.grace = _c._AFTER_DONE_GRACE_S
                waiter = conn.waiter = loop.create_future()
                assert conn.transport is not None
                conn.transport.write(
                    b"".join(
                        (
                            prefix,
                            request_id.encode("latin-1"),
                            b"\r\nContent-Length: %d\r\n\r\n" % len(body),
                            body,
                        )
                    )
                )
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
                    st = conn.status or 0
                    text = bytes(conn.err_body).decode("utf-8", "replace")
                    snippet = clip(text, 200).strip()  # scrub first: a key across the cut
                    err = f"HTTP {st}: {snippet}" if snippet else f"HTTP {st}"
                    if st == 429:
                        err_class = "http_429"
                    elif st >= 500:
                        err_class = "http_5xx"
                    else:
                        err_class = "http_4xx"
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
                conn.deadline = None
                if clean:
                    session.release(conn)  # resets the connection's attempt state
                else:
                    conn.abort()
    except asyncio.CancelledError:
        if not expired:
            raise  # cancelled by the caller, not by our deadline: no record
        timed_out = True
    return _c._finish_attempt(
        spec,
        sp,
        request_id=request_id,
        attempt=attempt,
        intended_at=intended_at,
        sent=sent,
        end=pc(),
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


def _why(exc: BaseException) -> str:
    text = str(exc)
    return f" ({type(exc).__name__}: {text})" if text else ""
