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

The connections (``RawSession``, ``RawConnection``) live in :mod:`chaoslib_infer.load.rawconn`;
``RawSession`` is re-exported here.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .attempts import (
    AFTER_DONE_GRACE_S,
    AttemptSpec,
    Deadline,
    exc_msg,
    finish_attempt,
    first_deadline,
    http_error,
)
from .rawconn import RawConnection
from .rawconn import RawSession as RawSession
from .records import perf_to_unix

__all__ = ["RawSession", "send_attempt_raw"]


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
    idem_name = getattr(spec, "idempotency_header", None)  # LoadSpec's; same key every attempt
    idem = f"\r\n{idem_name}: {request_id}".encode("latin-1") if idem_name else b""
    status: int | None = None
    replica: str | None = None
    err_class: str | None = None
    err: str | None = None
    after_done = False
    conn: RawConnection | None = None
    clean = False
    first_byte: float | None = None
    first_token: float | None = None
    done_at: float | None = None
    chunk_times: list[float] = []
    sp = session.parser_cls()
    kernel = False
    sent_source = "connect"
    retry_after: bytes | None = None
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
                                idem,
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
                retry_after = conn.retry_after
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
        body=body,
        chunk_times=chunk_times,
    )
    if retry_after is not None:  # seconds; an HTTP-date form: None
        rec["retry_after_s"] = _seconds(retry_after)
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


def _seconds(value: bytes) -> float | None:
    """A ``Retry-After`` header's delay in seconds (RFC 9110 delay-seconds), None otherwise."""
    try:
        return float(value.strip())
    except ValueError:
        return None
