"""The official OpenAI Python SDK as the load's client (``LoadSpec.client == "openai-sdk"``).

Users rarely call an inference service with our client: they call it with the ``openai`` package,
whose own retry and timeout policy decides how many generations a fault duplicates. With
``client: openai-sdk`` each logical request is one ``AsyncOpenAI().chat.completions.create(...,
stream=True)`` call, its stream read to the end, under the SDK's own policy: ``max_retries`` 2
and its timeouts (600 s per read, 5 s to connect) unless the plan sets ``sdk_max_retries`` /
``sdk_timeout_s``. The SDK retries 408, 409, 429, 5xx and connection errors (never a 400), after
``Retry-After`` (or ``retry-after-ms``) when the server sends one up to 120 s (a longer one: it
gives up), else 0.5 s x 2^n (at most 8 s) minus up to 25 % jitter (openai 3.60
``_base_client``).

**Retries made visible.** An SDK retry happens inside one ``create`` call; the framework's rule
is that no retry is silent (``docs/definitions.md``, "Denominators"). The SDK's ``http_client``
gets a :class:`RecordingTransport` (an ``httpx`` transport: public API) that sees every HTTP
attempt: each becomes its own record (the same shape as our client's, ``records.py``), with the
logical ``request_id`` (sent as ``X-Request-Id`` on every attempt, so the engine ledger ties
each generation to it) and ``attempt`` 1, 2, ...; ``final`` on the last. So duplicate
generations and wasted tokens (``measure/retrycost.py``) are attributed to the SDK's retries as
to ours. Each record also carries ``client: "openai-sdk"`` and ``retry_after_s`` (the
``Retry-After`` the answer carried, seconds; None without one).

**What it cannot measure.** Chunk times are taken in user space when the SDK's HTTP stack hands
the bytes up (``time_source: "loop"``), never kernel-stamped: the client's own event-loop delay
is inside TTFT, ITL and E2E, and no client lag (``p99_client_lag_s``) is measured. The SDK has no
first-token or idle timeout: a replica that hangs holds the request up to its read timeout (the
judge still counts it a timeout at its deadline, ``measure/inflight.py``). The send time of a
retry is when the SDK sent it (its backoff is not in the schedule). A reply cut mid-stream is
not retried by the SDK (it retries only before the response starts). Its CPU per request is
several times ours (``docs/definitions.md``, "The OpenAI SDK as the client").
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, cast

from chaoslib_infer.measure.sse import StreamParser

from .attempts import MAX_ERROR_BODY, exc_msg, finish_attempt, http_error
from .spec import LoadCounters, LoadSpec, endpoint_url

__all__ = [
    "SDK_CLIENT",
    "RecordingTransport",
    "SdkSession",
    "describe_client",
    "write_prior_attempts",
]

#: ``LoadSpec.client`` value of the OpenAI SDK client.
SDK_CLIENT = "openai-sdk"
#: The SDK's connection limits (openai 3.60 ``DEFAULT_CONNECTION_LIMITS``), kept with our transport.
_SDK_LIMITS = {"max_connections": 1000, "max_keepalive_connections": 100}


def _httpx() -> Any:
    """The ``httpx`` module the installed SDK is built on (``httpx``, or ``httpx2`` from 3.x)."""
    import openai

    base = openai.DefaultAsyncHttpxClient.__mro__[1]
    return sys.modules[base.__module__.split(".")[0]]


@dataclass
class _Attempt:
    """What the transport saw of one HTTP attempt (``time.perf_counter`` seconds)."""

    sent: float
    parser: StreamParser = field(default_factory=StreamParser)
    status: int | None = None
    replica: str | None = None
    first_byte: float | None = None
    first_token: float | None = None
    done_at: float | None = None
    end: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    err_class: str | None = None
    err: str | None = None
    retry_after_s: float | None = None
    sdk_retry_count: str | None = None


def _transport_error(exc: BaseException, hx: Any, att: _Attempt) -> tuple[str, str]:
    """Error class and message of an ``httpx`` exception during ``att``."""
    if isinstance(exc, hx.ConnectTimeout | hx.PoolTimeout):
        return "timeout_connect", exc_msg(exc)
    if isinstance(exc, hx.TimeoutException):
        return ("timeout_ttft" if att.first_token is None else "timeout_idle"), exc_msg(exc)
    if isinstance(exc, hx.ConnectError):
        return "connect", exc_msg(exc)
    return "reset", exc_msg(exc)


def _retry_after(headers: Any) -> float | None:
    """Seconds of a ``retry-after-ms`` / ``Retry-After`` header (delay form), else None."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return float(value) / scale
            except ValueError:
                return None
    return None


@functools.cache
def _timed_stream_class(hx: Any) -> Any:
    """The body stream of a 2xx attempt, an ``AsyncByteStream`` of ``hx`` (httpx only iterates
    its own kind): every read timed and fed to the attempt's SSE parser."""

    class TimedStream(hx.AsyncByteStream):  # type: ignore[misc,name-defined]
        def __init__(self, inner: Any, att: _Attempt) -> None:
            self._inner, self._att = inner, att

        async def __aiter__(self) -> AsyncIterator[bytes]:
            att, pc = self._att, time.perf_counter
            try:
                async for data in self._inner:
                    n = att.parser.feed(data)
                    if n:
                        now = pc()
                        if att.first_token is None:
                            att.first_token = now
                        att.chunk_times.extend([now] * n)
                    if att.parser.done and att.done_at is None:
                        att.done_at = pc()
                    yield data
            except Exception as exc:
                if att.err_class is None and att.done_at is None:
                    att.err_class, att.err = _transport_error(exc, hx, att)
                raise
            finally:
                att.end = att.end or pc()

        async def aclose(self) -> None:
            await self._inner.aclose()

    return TimedStream


class RecordingTransport:
    """An ``httpx`` async transport that records every HTTP attempt the SDK makes.

    Wraps the SDK's own kind of transport (``AsyncHTTPTransport`` with the SDK's connection
    limits); attempts are kept per ``X-Request-Id`` until :meth:`take` hands them over.
    ``httpx``: the module the SDK is built on (``httpx`` or ``httpx2``). ``inner``: another
    transport of that module to wrap (tests: an ``ASGITransport``).
    """

    def __init__(self, inner: Any = None) -> None:
        self.httpx = _httpx()
        limits = self.httpx.Limits(**_SDK_LIMITS)
        self._inner = inner if inner is not None else self.httpx.AsyncHTTPTransport(limits=limits)
        self._attempts: dict[str, list[_Attempt]] = {}

    def take(self, request_id: str) -> list[_Attempt]:
        """The attempts seen for ``request_id`` (in order), forgotten here."""
        return self._attempts.pop(request_id, [])

    async def handle_async_request(self, request: Any) -> Any:
        """Send ``request`` through the inner transport, recording the attempt."""
        hx = self.httpx
        att = _Attempt(sent=time.perf_counter())
        att.sdk_retry_count = request.headers.get("x-stainless-retry-count")
        self._attempts.setdefault(request.headers.get("x-request-id", ""), []).append(att)
        try:
            resp = await self._inner.handle_async_request(request)
        except Exception as exc:
            att.end = time.perf_counter()
            att.err_class, att.err = _transport_error(exc, hx, att)
            raise
        att.first_byte = time.perf_counter()
        att.status = resp.status_code
        att.replica = resp.headers.get("x-replica-id") or resp.headers.get("x-lab-server")
        att.retry_after_s = _retry_after(resp.headers)
        if 200 <= resp.status_code < 300:
            return hx.Response(
                resp.status_code,
                headers=resp.headers,
                stream=_timed_stream_class(hx)(resp.stream, att),
                extensions=resp.extensions,
            )
        try:
            raw = await resp.aread()
        except Exception as exc:
            att.end = time.perf_counter()
            att.err_class, att.err = _transport_error(exc, hx, att)
            raise
        att.end = time.perf_counter()
        att.err_class, att.err = http_error(
            resp.status_code, raw[:MAX_ERROR_BODY].decode("utf-8", "replace")
        )
        return hx.Response(
            resp.status_code, headers=resp.headers, content=raw, extensions=resp.extensions
        )

    async def aclose(self) -> None:
        """Close the inner transport."""
        await self._inner.aclose()

    async def __aenter__(self) -> RecordingTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class SdkSession:
    """The load's session for ``client: openai-sdk``: one ``AsyncOpenAI`` client whose
    ``http_client`` records every attempt (:class:`RecordingTransport`). Use as an async context
    manager inside the run's loop. ``inner_transport``: see :class:`RecordingTransport`.

    Raises:
        RuntimeError: the ``openai`` package is not installed (one line: how to install it).
    """

    def __init__(self, spec: LoadSpec, inner_transport: Any = None) -> None:
        try:
            import openai
        except ImportError:  # pragma: no cover - openai is a dependency
            raise RuntimeError(
                "client openai-sdk needs the openai package: pip install openai"
            ) from None
        self.spec = spec
        self.transport = RecordingTransport(inner_transport)
        hx = self.transport.httpx
        kwargs: dict[str, Any] = {}
        if spec.sdk_max_retries is not None:
            kwargs["max_retries"] = spec.sdk_max_retries
        if spec.sdk_timeout_s is not None:
            kwargs["timeout"] = hx.Timeout(spec.sdk_timeout_s, connect=spec.connect_timeout_s)
        self.client = openai.AsyncOpenAI(
            base_url=endpoint_url(spec).removesuffix("/chat/completions"),
            api_key=_api_key(spec.headers),
            http_client=openai.DefaultAsyncHttpxClient(
                transport=cast(Any, self.transport), trust_env=False
            ),
            **kwargs,
        )
        self.version = openai.__version__
        self.loop_attempts = 0

    async def __aenter__(self) -> SdkSession:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.client.close()

    def policy(self) -> dict[str, Any]:
        """The SDK's retry and timeout policy in force: ``{"max_retries", "timeout_s",
        "connect_timeout_s"}`` (seconds; None where the SDK's timeout has no such part)."""
        t = self.client.timeout
        read = getattr(t, "read", t)
        return {
            "max_retries": self.client.max_retries,
            "timeout_s": read,
            "connect_timeout_s": getattr(t, "connect", None),
        }

    async def send_attempt(
        self, spec: LoadSpec, body: bytes, request_id: str, attempt: int, intended_at: float | None
    ) -> dict[str, Any]:
        """One logical request through the SDK (``client.send_attempt``'s contract).

        Returns:
            The record of the SDK's last HTTP attempt (``attempt`` + the SDK's retries), with
            the records of its earlier attempts under ``"prior_attempts"`` (oldest first;
            :func:`write_prior_attempts` writes them). A request the SDK refused before any
            HTTP attempt is one record of class ``connect`` with the SDK's message.
        """
        payload = json.loads(body)
        extra = {k: v for k, v in payload.items() if k not in ("model", "messages", "stream")}
        headers = {k: v for k, v in spec.headers.items() if k.lower() != "authorization"}
        headers["X-Request-Id"] = request_id  # the SDK sends the key itself (``_api_key``)
        failure: BaseException | None = None
        try:
            stream = await self.client.chat.completions.create(
                model=payload["model"],
                messages=payload["messages"],
                stream=True,
                extra_headers=headers,
                extra_body=extra,
            )
            async for _ in stream:
                pass
        except Exception as exc:  # the SDK's verdict: what the records say is the transport's
            failure = exc
        atts = self.transport.take(request_id)
        if not atts:
            atts = [_Attempt(sent=time.perf_counter())]
            atts[0].err_class, atts[0].err = (
                "connect",
                exc_msg(failure or RuntimeError("no attempt")),
            )
        recs = [
            _record(spec, a, request_id, attempt + i, intended_at if i == 0 else None, body)
            for i, a in enumerate(atts)
        ]
        self.loop_attempts += len(recs)
        for r in recs[:-1]:
            r["final"] = False
        last = recs[-1]
        if last["ok"] and failure is not None:  # the parser saw a whole reply the SDK refused
            last.update(ok=False, error_class="stream_error", error=exc_msg(failure))
        if len(recs) > 1:
            last["prior_attempts"] = recs[:-1]
        return last

    def timing_summary(self) -> dict[str, Any]:
        """The clock part of the run summary: loop time only, no client lag measured."""
        return {"time_source": "loop", "kernel_attempts": 0, "loop_attempts": self.loop_attempts,
                "p50_client_lag_s": None, "p99_client_lag_s": None, "max_client_lag_s": None,
                "client_lag_reads": 0}  # fmt: skip


def _api_key(headers: dict[str, str]) -> str:
    """The bearer key of ``headers`` (the SDK needs one; ``"none"`` when the target has none)."""
    auth = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
    return auth.removeprefix("Bearer ").strip() or "none"


def _record(
    spec: LoadSpec,
    a: _Attempt,
    request_id: str,
    attempt: int,
    intended_at: float | None,
    body: bytes | None = None,
) -> dict[str, Any]:
    """The record of one SDK attempt (``attempts.finish_attempt``, plus ``client`` and
    ``retry_after_s``; ``body``: the request sent, for the prompt's size without usage)."""
    err_class, err = a.err_class, a.err
    if err_class is None and a.status is not None:
        a.parser.close()
        err_class, err = a.parser.classify()
    rec = finish_attempt(
        spec, a.parser, request_id=request_id, attempt=attempt, intended_at=intended_at,
        sent=a.sent, end=a.end or time.perf_counter(), status=a.status, replica=a.replica,
        err_class=err_class, err=err, timed_out=False, kind="total", after_done=False,
        done_at=a.done_at, first_byte=a.first_byte, first_token=a.first_token,
        chunk_times=a.chunk_times, body=body,
    )  # fmt: skip
    rec["client"] = SDK_CLIENT
    rec["retry_after_s"] = a.retry_after_s
    return rec


def write_prior_attempts(
    rec: dict[str, Any], write: Callable[[dict[str, Any]], bool], counters: LoadCounters
) -> bool:
    """Write the SDK's earlier attempts of ``rec`` (``"prior_attempts"``, removed from it) and
    count them as retries (attempts, retries, failed, errors by class; the request as retried,
    and as succeeded after a retry when ``rec`` is ok). False when a write failed."""
    prior = rec.pop("prior_attempts", [])
    for p in prior:
        if not write(p):
            return False
        counters.attempts += 1
        counters.retries += 1
        counters.failed += 1
        ec = p["error_class"]
        counters.errors_by_class[ec] = counters.errors_by_class.get(ec, 0) + 1
    if prior:
        counters.retried_requests += 1
        counters.succeeded_after_retry += int(bool(rec["ok"]))
    return True


def describe_client(spec: LoadSpec, session: object) -> dict[str, Any]:
    """What sent the load, for the run summary and the evidence: ``{"name": "chaoslib-infer",
    "transport", "retry": our policy}`` or ``{"name": "openai-sdk", "version", "policy": the
    SDK's in force (``SdkSession.policy``)}``."""
    if isinstance(session, SdkSession):
        return {"name": SDK_CLIENT, "version": session.version, "policy": session.policy()}
    return {"name": "chaoslib-infer", "transport": spec.transport}
