"""The recording Locust user's parts that need no Locust user: the attempt deadline on gevent,
the error class of an exception raised before the headers, the records file, an error reply's body, and the
response ``RecordStreams`` hands back to task code (``chaoslib_infer.locust.user``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent
from geventhttpclient._parser import HTTPParseError
from geventhttpclient.response import HTTPConnectionClosed
from locust.exception import CatchResponseError

from chaoslib_infer.load.attempts import (
    AFTER_DONE_GRACE_S,
    AttemptSpec,
    chunk_deadline,
    exc_msg,
    first_deadline,
)
from chaoslib_infer.load.records import scrub_record

__all__ = [
    "AppendWriter",
    "records_writer",
    "AttemptTimeout",
    "GreenletDeadline",
    "StreamClock",
    "ReplayResponse",
    "classify_exc",
    "error_body",
    "unwrap",
]

log = logging.getLogger(__name__)

_CONNECT_ERRNOS = frozenset(
    {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL}
)


class AttemptTimeout(BaseException):
    """Thrown into the user's greenlet when its attempt's armed deadline passes (a
    ``BaseException``, like ``gevent.Timeout``, so that no ``except Exception`` swallows it)."""


class GreenletDeadline:
    """One deadline per attempt (``time.perf_counter`` seconds) for the current greenlet, cheap to
    move later: ``move`` stores the new time and a timer firing before it re-arms itself (one loop
    timer per deadline period, not one per chunk). Moving it earlier re-arms at once."""

    __slots__ = ("_glet", "_loop", "_timer", "_old", "_armed", "when", "expired", "exc")

    def __init__(self, when: float) -> None:
        self._glet = gevent.getcurrent()
        self._loop = gevent.get_hub().loop
        self._old: list[Any] = []
        self.when = when
        self._armed = when
        self.expired = False
        self.exc = AttemptTimeout()
        self._timer: Any = None
        self._arm(when)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._old.append(self._timer)
        self._armed = when
        self._timer = self._loop.timer(max(when - time.perf_counter(), 0.0))
        self._timer.start(self._fire)

    def move(self, when: float) -> None:
        """Set the deadline to ``when`` (perf_counter seconds)."""
        self.when = when
        if when < self._armed and self._timer is not None:
            self._arm(when)

    def _fire(self) -> None:
        if self._timer is None:
            return
        if self.when > self._armed:
            self._arm(self.when)
            return
        self.expired = True
        self._glet.throw(self.exc)

    def close(self) -> None:
        """Disarm (idempotent)."""
        if self._timer is not None:
            self._timer.stop()
            self._old.append(self._timer)
            self._timer = None
        for t in self._old:
            t.close()
        self._old.clear()


class StreamClock:
    """When a streamed attempt's output came and when the attempt must end: the built-in client's
    deadline rule (:func:`chaoslib_infer.load.attempts.first_deadline`, ``chunk_deadline``,
    ``AFTER_DONE_GRACE_S``) kept on a :class:`GreenletDeadline` (times ``time.perf_counter``
    seconds).

    Attributes:
        deadline: the armed deadline (``close`` it when the attempt ends).
        kind: which deadline is armed: ``ttft``, ``idle``, ``total`` or ``done``.
        first_token: when the first output-bearing chunk came, or None.
        chunk_times: one entry per output chunk, its arrival time.
        done_at: when the stream's end (``[DONE]``) came, or None.
    """

    __slots__ = ("deadline", "kind", "first_token", "chunk_times", "done_at", "_idle", "_total")

    def __init__(self, spec: AttemptSpec, sent: float) -> None:
        self._total, self.kind, dl = first_deadline(spec, sent)
        self._idle = spec.idle_timeout_s
        self.deadline = GreenletDeadline(dl)
        self.first_token: float | None = None
        self.chunk_times: list[float] = []
        self.done_at: float | None = None

    def chunks(self, n: int, now: float) -> None:
        """``n`` output chunks came at ``now``: the idle (or total) deadline moves."""
        if self.first_token is None:
            self.first_token = now
        self.chunk_times.extend([now] * n)
        moved = chunk_deadline(self.kind, now, self._idle, self._total)
        if moved is not None:
            self.kind, dl = moved
            self.deadline.move(dl)

    def done(self, now: float) -> None:
        """The stream ended at ``now``: a short grace for the connection's end (total capped)."""
        self.done_at = now
        self.kind = "done"
        self.deadline.move(min(now + AFTER_DONE_GRACE_S, self._total))


def classify_exc(exc: BaseException) -> tuple[str, str]:
    """Error class and message of an exception raised before the response headers."""
    e = exc
    while isinstance(getattr(e, "original", None), BaseException):  # RetriesExceeded wraps
        e = e.original  # type: ignore[attr-defined]
    msg = exc_msg(e)
    if isinstance(e, socket.timeout | TimeoutError):
        return "timeout_connect", msg
    if isinstance(e, HTTPParseError) and not isinstance(e, HTTPConnectionClosed):
        return "garbled", "invalid HTTP response: " + msg
    if isinstance(e, socket.gaierror | ConnectionRefusedError):
        return "connect", msg
    if isinstance(e, OSError) and e.errno in _CONNECT_ERRNOS:
        return "connect", msg
    return "reset", msg


def unwrap(exc: BaseException) -> BaseException:
    while isinstance(getattr(exc, "original", None), BaseException):
        exc = exc.original  # type: ignore[attr-defined]
    return exc


def error_body(resp: Any) -> bytes:
    """The part of an error reply's body already received (its socket was released by the
    client after the status check; reading never blocks). geventhttpclient reads a non-2xx
    body into its ``_cached_content`` for its error log (``_conversation_str``): that first."""
    try:
        cached = getattr(resp, "_cached_content", None)
        if isinstance(cached, bytes | bytearray) and cached:
            return bytes(cached[:65536])
        r = resp._response
        return bytes(r._body_buffer[:65536]) if r is not None else b""
    except Exception:  # noqa: BLE001 - a body snippet is best effort
        return b""


class ReplayResponse:
    """What ``RecordStreams``' client returns for a recorded streaming call: the final attempt's
    status, headers and received body, readable afterwards the way task code reads a Locust
    response (``status_code``, ``ok``, ``headers``, ``content``, ``text``, ``json()``,
    ``iter_lines()``, ``iter_content()``, ``with ... as resp`` with ``success()``/``failure()``).

    ``success``/``failure`` do nothing: the attempt's Locust event was already fired with the
    recorded verdict (``record``), so a task cannot double-count it.
    """

    def __init__(self, record: dict[str, Any], status: int | None, headers: Any, body: bytes):
        self.record = record
        self.status_code = status or 0
        self.headers = headers if headers is not None else {}
        self.content = body
        self.error = None if record["ok"] else f"{record['error_class']}: {record['error']}"

    @property
    def ok(self) -> bool:
        """True when the recorded attempt succeeded."""
        return bool(self.record["ok"])

    @property
    def text(self) -> str:
        """The body decoded as UTF-8 (invalid bytes replaced)."""
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body parsed as JSON (raises ``ValueError`` when it is not, e.g. an SSE stream)."""
        return json.loads(self.text)

    def iter_lines(self) -> Iterator[str]:
        """The body's lines (without their line ends)."""
        yield from self.text.splitlines()

    def iter_content(self, chunk_size: int = 1024, decode_content: bool = True) -> Iterator[Any]:
        """The body in pieces of ``chunk_size`` bytes (decoded as UTF-8 with ``decode_content``)."""
        for i in range(0, len(self.content), chunk_size):
            piece = self.content[i : i + chunk_size]
            yield piece.decode("utf-8", "replace") if decode_content else piece

    def raise_for_status(self) -> None:
        """Raise ``CatchResponseError`` when the recorded attempt failed."""
        if self.error is not None:
            raise CatchResponseError(self.error)

    def success(self) -> None:
        """No-op (the attempt's verdict is the recorded one)."""

    def failure(self, _exc: Any = None) -> None:
        """No-op (the attempt's verdict is the recorded one)."""

    def __enter__(self) -> ReplayResponse:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class AppendWriter:
    """Append records to a JSONL file with ``O_APPEND`` and one ``os.write`` per line.

    Several processes may append to the same file: each line is written by one system call on a
    descriptor opened with ``O_APPEND``, which Linux serialises on local file systems, so lines
    never interleave. (``records.RecordWriter`` buffers and is for one process.) As that writer's,
    the text fields a server sent are scrubbed of known secrets (``records.scrub_record``) and
    the file is created owner-only (0600).

    Args:
        path: the records file; created if missing, never truncated.

    Raises:
        OSError: the file cannot be opened.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.count = 0

    def write(self, record: dict[str, Any]) -> None:
        """Write ``record`` as one JSON line.

        Raises:
            ValueError: the writer is closed or the record is not JSON-serialisable.
            OSError: the write failed (disk full).
        """
        if self._fd is None:
            raise ValueError("AppendWriter is closed")
        record = scrub_record(record)
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        view = memoryview((line + "\n").encode())
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self.count += 1

    def close(self) -> None:
        """Close the descriptor; idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_WRITERS: dict[tuple[int, str], AppendWriter] = {}


def records_writer(path: str | os.PathLike[str]) -> AppendWriter:
    """The process's ``AppendWriter`` for ``path`` (one per process and path; a forked Locust
    worker opens its own).

    Raises:
        OSError: the file cannot be opened.
    """
    key = (os.getpid(), str(Path(path).resolve()))
    w = _WRITERS.get(key)
    if w is None:
        w = _WRITERS[key] = AppendWriter(path)
        log.info("chaoslib-infer: recording attempts to %s (pid %d)", w.path, os.getpid())
    return w
