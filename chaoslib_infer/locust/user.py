"""A Locust user that streams LLM replies and records every attempt in this project's format.

Import it from a locustfile (importing Locust monkey-patches the process with gevent)::

    from locust import constant_throughput
    from chaoslib_infer.locust.user import LLMStreamUser

    class Chat(LLMStreamUser):
        wait_time = constant_throughput(2)   # per user; closed loop (see "Limits")
        api = "chat"
        max_tokens = 32

``LLMStreamUser`` runs on Locust's ``FastHttpUser`` client (geventhttpclient). Its default task
calls ``self.stream()``: one logical request, sent as one or more attempts under the framework's
retry policy (``retry_attempts``, ``retry_backoff_s``, ``retry_on``; same semantics as
``chaoslib_infer.load.client.LoadSpec``). Every attempt

* is one Locust request event (``POST`` named by the endpoint path; ``response_time`` is the
  attempt's end-to-end time in ms, ``response_length`` the body bytes; a failed attempt is a
  Locust failure ``"<error_class>: <message>"``), so Locust's web UI, ``--csv`` stats and
  distributed mode see every attempt, retries included;
* is one record line (``docs/contracts.md`` section 3) appended to the records file: chunk times
  taken as each received block is parsed, the error classes of the built-in client (``connect``,
  ``timeout_connect``, ``timeout_ttft``, ``timeout_idle``, ``timeout_total``, ``http_429``,
  ``http_4xx``, ``http_5xx``, ``reset``, ``stream_error``, ``empty``, ``garbled``,
  ``truncated``), the logical request id sent as ``X-Request-Id`` (a UUID4, the same for every
  attempt of a logical request), ``attempt`` 1, 2, ... and ``final``. The record is built by the
  same bookkeeping as the built-in client's (``chaoslib_infer.load.attempts``: deadlines, error
  classes, ``finish_attempt``), so both clients' records mean the same.

The records file: ``--chaos-records PATH`` on Locust's command line (added by this module), else
``$CHAOS_INFER_RECORDS``, else ``records.jsonl`` in the working directory. Every process
(``--processes N`` forks, workers on other machines) appends to its own open file descriptor with
``O_APPEND`` and one ``write`` per line, so the processes of one machine can share one file.
When the master of a distributed run has ``--chaos-records-via-master`` (the drills'
``distributed`` load), a worker sends its records to the master with Locust's stats reports
instead, and the master appends them (``chaoslib_infer.locust.relay``). A worker's attempts
still in flight when it is killed have no record.

``RecordStreams`` wraps an existing locustfile's user without editing its tasks: its
``self.client.post(<.../completions>, json={... "stream": true ...})`` calls are sent by the
recording path above and answered with the received body (see its docstring).

Limits: Locust users are **closed loop** (a user sends its next request when the previous one
and its wait are done), not an open-loop schedule: when the service slows down, fewer requests are
sent, and latency is under-reported (coordinated omission, ``docs/definitions.md``, "Send time").
``intended_at`` of a first attempt is its send time (no schedule); a retry's is the end of its
backoff. An attempt still on the wire when Locust stops its user (``--stop-timeout`` passed) is
recorded as the built-in client records one cut at its stop: class ``cut_off``, outcome unknown
(``client.cut_off_record``); it fires no Locust event.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import gevent
from geventhttpclient._parser import HTTPParseError
from geventhttpclient.response import HTTPConnectionClosed
from locust import FastHttpUser, events, task
from locust.exception import CatchResponseError

from chaoslib_infer.load.attempts import (
    exc_msg,
    finish_attempt,
    http_error,
)
from chaoslib_infer.load.client import (
    DEFAULT_RETRY_ON,
    LoadSpec,
    build_body,
    cut_off_record,
    endpoint_url,
    logical_request_id,
    retry_backoff_delay,
)
from chaoslib_infer.locust import relay
from chaoslib_infer.locust.attempt_parts import (
    AppendWriter,
    AttemptTimeout,
    ReplayResponse,
    StreamClock,
    classify_exc,
    error_body,
    records_writer,
    unwrap,
)
from chaoslib_infer.measure.sse import StreamParser

__all__ = [
    "RECORDS_ENV",
    "AppendWriter",
    "LLMStreamUser",
    "RecordStreams",
    "ReplayResponse",
    "StreamingUser",
    "records_writer",
]

log = logging.getLogger(__name__)

#: Environment variable naming the records file (``--chaos-records`` takes precedence).
RECORDS_ENV = "CHAOS_INFER_RECORDS"
_DEFAULT_RECORDS = "records.jsonl"
_BLOCK = 65536


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    parser.add_argument(
        "--chaos-records",
        default=None,
        help=f"chaoslib-infer records file (JSONL, appended; default ${RECORDS_ENV} or "
        f"{_DEFAULT_RECORDS})",
    )


_RUN_IDS: dict[int, str] = {}
_COUNTERS: dict[int, Iterator[int]] = {}


relay.use_writer(records_writer)  # the master of a distributed run appends its workers' records


def _next_request_id() -> str:
    """A logical request id unique over the processes of a run: a random run id per process
    (drawn after any fork) and a per-process counter, as a UUID4 string."""
    pid = os.getpid()
    if pid not in _RUN_IDS:
        _RUN_IDS[pid] = os.urandom(4).hex()
        _COUNTERS[pid] = itertools.count()
    return logical_request_id(_RUN_IDS[pid], next(_COUNTERS[pid]))


class StreamingUser(FastHttpUser):
    """Base of ``LLMStreamUser`` and ``RecordStreams``: the recording machinery, no task.

    A Locust user streaming ``/v1/chat/completions`` or ``/v1/completions`` (module docstring).

    Class attributes (override in a subclass; times in seconds): ``api`` (``"chat"`` or
    ``"completions"``), ``model``, ``max_tokens``, ``prompt_words`` (words after the random nonce
    of the default prompt), ``include_usage``, ``extra_body``, ``request_headers``, ``timeout_s``
    (per-attempt total), ``connect_timeout_s``, ``ttft_timeout_s`` / ``idle_timeout_s`` (None: no
    limit), ``retry_attempts`` (1 = no retry), ``retry_backoff_s``, ``retry_on`` (error classes),
    ``records_path`` (None: ``--chaos-records``, ``$CHAOS_INFER_RECORDS``, ``records.jsonl``),
    ``report_ttft`` (also fire a ``TTFT`` request event per successful attempt, so the web UI
    shows TTFT percentiles; off by default because Locust then counts it as a request).
    ``host`` is the service's base URL (``--host``).

    Raises:
        ValueError: from ``__init__``, an invalid attribute (one line, as ``LoadSpec``'s).
    """

    abstract = True

    api: ClassVar[str] = "chat"
    model: ClassVar[str] = "sim"
    max_tokens: ClassVar[int] = 32
    prompt_words: ClassVar[int] = 16
    include_usage: ClassVar[bool] = True
    extra_body: ClassVar[dict[str, Any]] = {}
    request_headers: ClassVar[dict[str, str]] = {}
    timeout_s: ClassVar[float] = 30.0
    connect_timeout_s: ClassVar[float] = 3.0
    ttft_timeout_s: ClassVar[float | None] = 10.0
    idle_timeout_s: ClassVar[float | None] = 5.0
    retry_attempts: ClassVar[int] = 1
    retry_backoff_s: ClassVar[float] = 0.2
    retry_on: ClassVar[tuple[str, ...]] = DEFAULT_RETRY_ON
    records_path: ClassVar[str | None] = None
    report_ttft: ClassVar[bool] = False

    def __init__(self, environment: Any) -> None:
        self.spec = self.build_spec(self.host or environment.host or "")
        # geventhttpclient's own timeouts: connect as ours; reads only as a backstop (ours fire first)
        self.connection_timeout = self.spec.connect_timeout_s
        self.network_timeout = self.spec.attempt_timeout + 10.0
        super().__init__(environment)
        self._session = self.client  # the real FastHttpSession (RecordStreams proxies .client)
        self._url = endpoint_url(self.spec)
        self._name = "/" + self._url.split("://", 1)[-1].split("/", 1)[-1]
        self._rng = random.Random()
        key = os.environ.get("CHAOS_INFER_API_KEY", "").strip()
        self._headers: dict[str, str] = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "Accept-Encoding": "identity",  # chunk times need the bytes as sent
        }
        if key and not any(k.lower() == "authorization" for k in self.request_headers):
            self._headers["Authorization"] = f"Bearer {key}"
        self._headers.update(self.request_headers)
        opts = getattr(environment, "parsed_options", None)
        path = (
            self.records_path
            or getattr(opts, "chaos_records", None)
            or os.environ.get(RECORDS_ENV)
            or _DEFAULT_RECORDS
        )
        self.records = relay.records_sink(environment, path)  # a worker: to its master

    @classmethod
    def build_spec(cls, host: str) -> LoadSpec:
        """The ``LoadSpec`` (request shape, timeouts, retry policy) of this class for ``host``.

        Raises:
            ValueError: an invalid attribute or host (one-line message naming the class).
        """
        try:
            return LoadSpec(
                url=host,
                api=cls.api,  # type: ignore[arg-type]
                model=cls.model,
                max_tokens=cls.max_tokens,
                prompt_words=cls.prompt_words,
                include_usage=cls.include_usage,
                extra_body=dict(cls.extra_body),
                timeout_s=cls.timeout_s,
                connect_timeout_s=cls.connect_timeout_s,
                ttft_timeout_s=cls.ttft_timeout_s,
                idle_timeout_s=cls.idle_timeout_s,
                retry_attempts=cls.retry_attempts,
                retry_backoff_s=cls.retry_backoff_s,
                retry_on=tuple(cls.retry_on),
            )
        except ValueError as exc:
            raise ValueError(f"{cls.__name__}: {exc}") from None

    def body(self, prompt: str | None = None, max_tokens: int | None = None) -> dict[str, Any]:
        """A request body of this user's shape: the default prompt (a random nonce, then
        ``prompt_words`` words), or ``prompt`` (sent as is), and ``max_tokens``."""
        body = build_body(self.spec, self._rng)
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if prompt is not None:
            if "messages" in body:
                body["messages"] = [{"role": "user", "content": prompt}]
            else:
                body["prompt"] = prompt
        return body

    def stream(self, body: dict[str, Any] | None = None, name: str | None = None) -> dict[str, Any]:
        """Send one logical request (its attempts under the retry policy) and record them.

        Args:
            body: the JSON body (default ``self.body()``); ``"stream": true`` is forced, and
                ``stream_options.include_usage`` added when ``include_usage`` is set.
            name: Locust's request name (default the endpoint path).

        Returns:
            The final attempt's record (``docs/contracts.md`` section 3).
        """
        return self._logical(self._payload(body), name)[0]

    def _payload(self, body: dict[str, Any] | None) -> bytes:
        b = dict(body) if body is not None else self.body()
        b["stream"] = True
        if self.spec.include_usage and "stream_options" not in b:
            b["stream_options"] = {"include_usage": True}
        return json.dumps(b, separators=(",", ":")).encode()

    def _logical(
        self, payload: bytes, name: str | None, keep_body: bool = False, url: str | None = None
    ) -> tuple[dict[str, Any], Any]:
        spec = self.spec
        request_id = _next_request_id()
        due: float | None = None
        jitter = random.Random(f"{request_id}:retry")
        for n in range(1, spec.retry_attempts + 1):
            sent_unix = time.time()
            try:
                rec, extra = self._attempt(payload, request_id, n, due, name, keep_body, url)
            except gevent.GreenletExit:  # Locust stopped this user mid-attempt
                cut_at = time.time()
                due_at = sent_unix if due is None else due
                self.records.write(cut_off_record(request_id, n, due_at, sent_unix, cut_at))
                raise
            retry = (
                not rec["ok"] and n < spec.retry_attempts and rec["error_class"] in spec.retry_on
            )
            rec["final"] = not retry
            self.records.write(rec)
            if not retry:
                return rec, extra
            retry_at = time.perf_counter() + retry_backoff_delay(spec, n, jitter)
            gevent.sleep(max(retry_at - time.perf_counter(), 0.0))
            due = time.time() + (retry_at - time.perf_counter())
        raise AssertionError("unreachable")  # pragma: no cover

    def _attempt(
        self,
        payload: bytes,
        request_id: str,
        attempt: int,
        intended_at: float | None,
        name: str | None,
        keep_body: bool,
        url: str | None = None,
    ) -> tuple[dict[str, Any], Any]:
        """One HTTP attempt: its record and, with ``keep_body``, ``(status, headers, body)``.
        ``url``: the absolute endpoint URL (default the endpoint of ``api`` under ``host``)."""
        spec = self.spec
        url = url or self._url
        pc = time.perf_counter
        parser = StreamParser()
        headers = dict(self._headers)
        headers["X-Request-Id"] = request_id
        status: int | None = None
        replica: str | None = None
        resp_headers: Any = None
        first_byte: float | None = None
        parts: list[bytes] = []
        nbytes = 0
        err_class: str | None = None
        err: str | None = None
        after_done = False
        timed_out = False
        start_unix = time.time()
        sent = pc()
        clock = StreamClock(spec, sent)
        deadline = clock.deadline
        resp: Any = None
        try:
            try:
                resp = self._session.request(
                    "POST", url, name=name or self._name, data=payload,  # type: ignore[arg-type]
                    headers=headers, stream=True, catch_response=True,
                )  # fmt: skip
            except AttemptTimeout as exc:
                if exc is not deadline.exc:
                    raise
                timed_out = True
            if resp is not None:
                resp.__enter__()
                error = getattr(resp, "error", None)
                code = resp.status_code or 0
                if code:
                    first_byte = pc()
                    status = code
                    resp_headers = resp.headers
                    if resp_headers is not None:
                        replica = resp_headers.get("X-Replica-Id") or resp_headers.get(
                            "X-Lab-Server"
                        )
                if code and not 200 <= code < 300:
                    snippet = error_body(resp)
                    parts.append(snippet)
                    # scrubbed of known secrets, then cut (http_error), as the built-in client's
                    err_class, err = http_error(code, snippet.decode("utf-8", "replace"))
                elif error is not None or not code:
                    if error is not None and unwrap(error) is deadline.exc:
                        timed_out = True
                    else:
                        err_class, err = classify_exc(error or OSError("no response"))
                else:
                    r = resp._response
                    buf = r._body_buffer
                    try:
                        while True:
                            if buf:
                                data = bytes(buf)
                                del buf[:]
                                nbytes += len(data)
                                if keep_body:
                                    parts.append(data)
                                n = parser.feed(data)
                                if n:
                                    clock.chunks(n, pc())
                                if parser.done and clock.done_at is None:
                                    clock.done(pc())
                            if r.message_complete:
                                break
                            sock = r._sock
                            if sock is None:
                                raise HTTPConnectionClosed("connection closed.")
                            data = sock.recv(_BLOCK)
                            if not data:
                                r.feed(b"")  # EOF: completes a body delimited by the close
                                if not r.message_complete and not buf:
                                    raise HTTPConnectionClosed(
                                        "connection closed before the reply was complete"
                                    )
                            else:
                                r.feed(data)
                        parser.close()
                        err_class, err = parser.classify()
                    except AttemptTimeout as exc:
                        if exc is not deadline.exc:
                            raise
                        timed_out = True
                        r.release()
                    except (HTTPParseError, HTTPConnectionClosed, OSError) as exc:
                        r.release()
                        err_class, err = "reset", exc_msg(exc)
                        after_done = clock.done_at is not None
        finally:
            deadline.close()
        rec = finish_attempt(
            spec, parser, request_id=request_id, attempt=attempt, intended_at=intended_at,
            sent=sent, end=pc(), status=status, replica=replica, err_class=err_class, err=err,
            timed_out=timed_out, kind=clock.kind, after_done=after_done, done_at=clock.done_at,
            first_byte=first_byte, first_token=clock.first_token, chunk_times=clock.chunk_times,
            body=payload,
        )  # fmt: skip
        self._report(resp, rec, nbytes, name, start_unix, url)
        return rec, ((status, resp_headers, b"".join(parts)) if keep_body else None)

    def _report(
        self,
        resp: Any,
        rec: dict[str, Any],
        nbytes: int,
        name: str | None,
        start_unix: float,
        url: str,
    ) -> None:
        """Fire Locust's request event for one attempt (through the response's own context
        manager when there is one, so request hooks see Locust's usual arguments)."""
        ms = (rec["end_at"] - rec["sent_at"]) * 1000.0
        info = {
            "request_id": rec["request_id"],
            "attempt": rec["attempt"],
            "error_class": rec["error_class"],
            "ttft_s": None
            if rec["first_token_at"] is None
            else rec["first_token_at"] - rec["sent_at"],
            "output_tokens": rec["output_tokens"],
        }
        failure = None if rec["ok"] else CatchResponseError(f"{rec['error_class']}: {rec['error']}")
        if resp is not None:
            meta = resp.request_meta
            meta["response_time"] = ms
            meta["response_length"] = nbytes
            meta["context"] = {**(meta.get("context") or {}), "chaos_infer": info}
            if failure is None:
                resp.success()
            else:
                resp.failure(failure)
            resp.__exit__(None, None, None)
        else:
            self.environment.events.request.fire(
                request_type="POST", name=name or self._name, response_time=ms,
                response_length=nbytes, exception=failure, response=None,
                context={**self.context(), "chaos_infer": info}, url=url,
                start_time=start_unix,
            )  # fmt: skip
        if self.report_ttft and rec["ok"] and info["ttft_s"] is not None:
            self.environment.events.request.fire(
                request_type="TTFT", name=name or self._name, response_time=info["ttft_s"] * 1000,
                response_length=0, exception=None, response=None, context={}, url=url,
                start_time=start_unix,
            )  # fmt: skip


class _RecordingClient:
    """Proxy of a ``FastHttpSession``: streaming completions POSTs go through the user's
    recording path; everything else goes to the real client unchanged."""

    def __init__(self, client: Any, user: StreamingUser) -> None:
        self._client = client
        self._user = user

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def post(self, url: str, data: Any = None, json: Any = None, **kwargs: Any) -> Any:
        """``FastHttpSession.post``; recorded when ``url`` ends with ``/completions`` and the JSON
        body (``json=`` or ``data=`` JSON text) has ``"stream": true``."""
        return self.request("POST", url, data=data, json=json, **kwargs)

    def request(self, method: str, url: str, **kwargs: Any) -> Any:
        """``FastHttpSession.request``, recorded for streaming completions POSTs (see ``post``)."""
        body = _streaming_body(method, url, kwargs.get("json"), kwargs.get("data"))
        if body is None:
            return self._client.request(method, url, **kwargs)
        payload = self._user._payload(body)
        full = self._client._build_url(url)
        name = kwargs.get("name") or url  # Locust's own default name: the URL as given
        rec, (status, headers, raw) = self._user._logical(payload, name, True, full)
        return ReplayResponse(rec, status, headers, raw)


def _streaming_body(method: str, url: str, js: Any, data: Any) -> dict[str, Any] | None:
    if method.upper() != "POST" or not url.split("?", 1)[0].rstrip("/").endswith("/completions"):
        return None
    body = js
    if body is None and isinstance(data, str | bytes):
        try:
            body = json.loads(data)
        except ValueError:
            return None
    if isinstance(body, dict) and body.get("stream") is True:
        return body
    return None


class LLMStreamUser(StreamingUser):
    """``StreamingUser`` with a default task, ``chat`` (one logical request with the default
    prompt), used only when the subclass declares no task of its own (Locust would otherwise mix
    it into the subclass's tasks)."""

    abstract = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = [t for t in cls.tasks if t is not LLMStreamUser.chat]
        if own:
            cls.tasks = own

    @task
    def chat(self) -> None:
        """The default task: one logical request with the default prompt."""
        self.stream()


class RecordStreams(StreamingUser):
    """Mixin for an existing user class whose tasks call ``self.client.post(...)`` themselves::

        class Recorded(RecordStreams, TeamUser):   # RecordStreams first
            pass

    After ``__init__`` its ``self.client`` is a proxy: a ``POST`` to a URL ending with
    ``/completions`` whose JSON body has ``"stream": true`` is sent by ``LLMStreamUser``'s
    recording path (retries included, one Locust event and one record per attempt) to the same
    URL (the body's own ``model``, messages and ``max_tokens`` are sent as they are; ``"stream":
    true`` and, with ``include_usage``, ``stream_options`` added), and answered with a ``ReplayResponse`` once the stream
    has ended (task code that reads the body line by line reads it after the fact). Any other call
    goes to the real ``FastHttpSession``. The tasks, ``wait_time`` and ``on_start`` of the wrapped
    class are kept; no task is added. The request shape attributes (``timeout_s``, retries, ...)
    are ``StreamingUser``'s.
    """

    abstract = True

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        self.client = _RecordingClient(self.client, self)  # type: ignore[assignment]
