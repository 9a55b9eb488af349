"""The bookkeeping of one HTTP attempt that every transport shares: error classes, deadlines, record.

Used by the aiohttp path (``client.send_attempt``), the raw HTTP/1.1 transport (``rawhttp``) and
the Locust user (``chaoslib_infer.locust.user``), so that their records mean the same
(``docs/contracts.md`` section 3, ``docs/definitions.md``, "Metrics" and "Denominators"):

* the error classes (:data:`ERROR_CLASSES`, :data:`TIMEOUT_CLASSES`, :data:`CUT_OFF`), the class
  of an HTTP status (:func:`http_error_class`) and of an exception's message (:func:`exc_msg`);
* the attempt's deadlines: the first one armed at send (:func:`first_deadline`: ``ttft`` or
  ``total``), the one after each output-bearing chunk (:func:`chunk_deadline`: ``idle`` or
  ``total``), the grace after ``[DONE]`` (:data:`AFTER_DONE_GRACE_S`), and the asyncio timer that
  enforces them (:class:`Deadline`);
* the record itself (:func:`finish_attempt`), from the transport's ``time.perf_counter`` times.

Times are ``time.perf_counter`` seconds unless a name says unix.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from typing import Any, Protocol

from chaoslib_infer.measure.sse import StreamParser
from chaoslib_infer.safety.redact import clip

from .prompt_size import prompt_fields
from .records import perf_to_unix

__all__ = [
    "AFTER_DONE_GRACE_S",
    "CUT_OFF",
    "NOT_SENT",
    "ERROR_CLASSES",
    "MAX_ERROR_BODY",
    "TIMEOUT_CLASSES",
    "AttemptSpec",
    "Deadline",
    "chunk_deadline",
    "exc_msg",
    "finish_attempt",
    "first_deadline",
    "http_error",
    "http_error_class",
]

#: Every error class an attempt record may carry (contracts.md section 3).
ERROR_CLASSES: tuple[str, ...] = (
    "connect",
    "timeout_connect",
    "timeout_ttft",
    "timeout_idle",
    "timeout_total",
    "http_429",
    "http_4xx",
    "http_5xx",
    "reset",
    "stream_error",
    "empty",
    "garbled",
    "truncated",
    "cut_off",
    "not_sent",
)
#: An attempt still in flight when the load stopped: recorded with its send time and how long it
#: had been in flight, outcome unknown (``docs/definitions.md``, "Windows"). Never a timeout by
#: itself; :mod:`chaoslib_infer.measure.metrics` leaves it out of the rates and counts it.
CUT_OFF = "cut_off"
#: A request due by the open-loop schedule that found the in-flight cap full and was not sent: the
#: service held every slot (``docs/definitions.md``, "Send time"). A failure of the service when
#: the client itself kept up (it counts in the availability and error rate); never retried.
NOT_SENT = "not_sent"
#: Classes that count in ``timeout_rate``.
TIMEOUT_CLASSES: frozenset[str] = frozenset(c for c in ERROR_CLASSES if c.startswith("timeout_"))
#: Bytes of a non-2xx reply's body read for its error message.
MAX_ERROR_BODY = 64 * 1024
#: Seconds an attempt waits after ``[DONE]`` for the reply to end before it stops waiting (the
#: reply is then judged by the stream parser alone).
AFTER_DONE_GRACE_S = 0.5


class AttemptSpec(Protocol):
    """What the attempt bookkeeping reads of a load spec (``client.LoadSpec`` has it all).

    Times in seconds; ``ttft_timeout_s`` / ``idle_timeout_s`` None: no limit.
    """

    headers: dict[str, str]
    connect_timeout_s: float
    ttft_timeout_s: float | None
    idle_timeout_s: float | None

    @property
    def attempt_timeout(self) -> float:
        """Total time limit of one attempt."""
        ...


def exc_msg(exc: BaseException) -> str:
    """``"TypeName: text"`` of an exception (``"TypeName"`` without text), scrubbed of known
    secrets and cut to 300 characters (:func:`chaoslib_infer.safety.redact.clip`)."""
    text = str(exc)
    return clip(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, 300)


def http_error_class(status: int) -> str:
    """The error class of a non-2xx HTTP status: ``http_429``, ``http_5xx`` (500 and up), else
    ``http_4xx`` (any other status, a 3xx included: no redirect is followed)."""
    if status == 429:
        return "http_429"
    return "http_5xx" if status >= 500 else "http_4xx"


def http_error(status: int, body: str) -> tuple[str, str]:
    """Error class and message of a non-2xx reply: ``"HTTP 503: <body>"``, the body scrubbed of
    known secrets before it is cut to 200 characters (a key echoed across the cut leaves no
    prefix), ``"HTTP 503"`` when the body is blank."""
    snippet = clip(body, 200).strip()
    return http_error_class(status), f"HTTP {status}: {snippet}" if snippet else f"HTTP {status}"


def first_deadline(spec: AttemptSpec, sent: float) -> tuple[float, str, float]:
    """The deadlines armed when an attempt is sent at ``sent``.

    Returns:
        ``(total_dl, kind, dl)``: the attempt's end-to-end deadline (``sent +
        spec.attempt_timeout``), and the first one to arm: ``("ttft", sent + ttft_timeout_s)``
        when that comes first, else ``("total", total_dl)``.
    """
    total_dl = sent + spec.attempt_timeout
    ttft_dl = sent + spec.ttft_timeout_s if spec.ttft_timeout_s is not None else math.inf
    if ttft_dl < total_dl:
        return total_dl, "ttft", ttft_dl
    return total_dl, "total", total_dl


def chunk_deadline(
    kind: str, now: float, idle: float | None, total_dl: float
) -> tuple[str, float] | None:
    """The deadline after an output-bearing chunk at ``now``, or None when it stays as it is.

    With an idle limit: ``("idle", now + idle)`` when that comes before ``total_dl``, else
    ``("total", total_dl)``. Without one: ``("total", total_dl)`` once the first token has ended
    the ``ttft`` deadline, None afterwards.
    """
    if idle is not None:
        new_dl = now + idle
        return ("idle", new_dl) if new_dl < total_dl else ("total", total_dl)
    if kind == "ttft":
        return "total", total_dl
    return None


class Deadline:
    """Cancel the current task at a deadline (``time.perf_counter`` seconds), like
    ``asyncio.timeout``, but cheap to move later: ``move`` only stores the new time, and the armed
    timer re-arms itself at the stored time when it fires before it (one loop timer per deadline
    period instead of a cancel and a new timer on every chunk). Moving it earlier re-arms at once.

    Raises:
        RuntimeError: made outside a running task.
    """

    __slots__ = ("_loop", "_task", "_cancelling", "_handle", "_armed", "when", "expired", "_result")

    def __init__(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - send_attempt always runs in a task
            raise RuntimeError("Deadline needs a running task")
        self._loop = loop
        self._task = task
        self._cancelling = task.cancelling()
        self.when = when
        self.expired = False
        self._result: bool | None = None
        self._armed = when
        self._handle: asyncio.TimerHandle | None = self._arm(when)

    def _arm(self, when: float) -> asyncio.TimerHandle:
        return self._loop.call_at(self._loop.time() + (when - time.perf_counter()), self._fire)

    def move(self, when: float) -> None:
        """Set the deadline to ``when`` (perf_counter seconds)."""
        self.when = when
        if when < self._armed and self._handle is not None:
            self._handle.cancel()
            self._armed = when
            self._handle = self._arm(when)

    def _fire(self) -> None:
        if self.when > self._armed:  # moved later since armed: wait for the new time
            self._armed = self.when
            self._handle = self._arm(self.when)
            return
        self._handle = None
        self.expired = True
        self._task.cancel()

    def close(self) -> bool:
        """Disarm (idempotent). Returns True when the deadline expired and the task's pending
        cancellation is ours alone (then a ``CancelledError`` seen by the caller is a timeout)."""
        if self._result is None:
            if self._handle is not None:
                self._handle.cancel()
                self._handle = None
            self._result = self.expired and self._task.uncancel() <= self._cancelling
        return self._result


def finish_attempt(
    spec: AttemptSpec,
    parser: StreamParser,
    *,
    request_id: str,
    attempt: int,
    intended_at: float | None,
    sent: float,
    end: float,
    status: int | None,
    replica: str | None,
    err_class: str | None,
    err: str | None,
    timed_out: bool,
    kind: str,
    after_done: bool,
    done_at: float | None,
    first_byte: float | None,
    first_token: float | None,
    chunk_times: list[float],
    body: bytes | str | Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The attempt's record, shared by every transport (aiohttp, ``rawhttp``, the Locust user).

    Args:
        spec: the load spec (timeouts for the messages). parser: the attempt's SSE parser.
        sent, end, done_at, first_byte, first_token, chunk_times: ``time.perf_counter`` seconds
            (``end``: when the transport finished; ``done_at``: ``[DONE]`` seen).
        kind: the deadline that was armed when the attempt ended (``ttft``, ``idle``, ``total``,
            ``done``); with ``timed_out`` it names the timeout class.
        after_done: the transport failed or timed out after ``[DONE]``: the reply is judged by the
            parser alone.
        body: the request body sent, for the prompt's size when the reply carries no usage
            (:mod:`chaoslib_infer.load.prompt_size`).
        The other arguments go to the record as they are (``intended_at``: unix seconds, None:
        the send time).

    Returns:
        One record (``docs/definitions.md``, "Metrics" and "Denominators"): unix-second times,
        ``ok``/``error_class``/``error``, ``output_tokens`` from usage else the chunk count,
        ``final`` True and ``time_source`` ``"loop"`` (the retry policy and the raw transport
        change them where they apply), ``prompt_tokens`` and ``prompt_tokens_source``
        (``"usage"``: the engine's count; ``"estimate"``: ours from ``body``; None: neither),
        ``chunk_path``: the parser's (``"compiled"`` | ``"python"``, ``measure.chunkpath``).
    """
    if timed_out:
        if kind == "done":
            after_done = True  # reply was complete; the server just kept the socket open
        elif kind == "ttft":
            err_class, err = "timeout_ttft", f"no output within {spec.ttft_timeout_s} s"
        elif kind == "idle":
            err_class, err = "timeout_idle", f"no output for {spec.idle_timeout_s} s"
        else:
            err_class, err = "timeout_total", f"attempt exceeded {spec.attempt_timeout} s"
    if after_done:
        # [DONE] arrived before the transport failed or the grace timer fired: judge the reply
        parser.close()
        err_class, err = parser.classify()
    if done_at is not None and err_class is None:
        end = done_at
    if parser.usage_tokens is not None:
        output_tokens, source = parser.usage_tokens, "usage"
    else:
        output_tokens, source = len(chunk_times), "chunks"
    sent_unix = perf_to_unix(sent)
    return {
        "request_id": request_id,
        "attempt": attempt,
        "final": True,
        "intended_at": sent_unix if intended_at is None else intended_at,
        "sent_at": sent_unix,
        "status": status,
        "ok": err_class is None,
        "error_class": err_class,
        "error": err,
        "first_byte_at": None if first_byte is None else perf_to_unix(first_byte),
        "first_token_at": None if first_token is None else perf_to_unix(first_token),
        "chunk_times": [perf_to_unix(t) for t in chunk_times],
        "end_at": perf_to_unix(end),
        "output_tokens": output_tokens,
        "tokens_source": source,
        "replica": replica,
        "text_len": parser.text_len,
        "time_source": "loop",  # the raw transport says "kernel" where the kernel stamped it
        **prompt_fields(parser.usage_prompt_tokens, body),
        "chunk_path": parser.chunk_path,  # "compiled" | "python" (``measure.chunkpath``)
    }
