"""Open-loop streaming load generator for OpenAI-compatible inference services.

Two transports, same records and error classes (``LoadSpec.transport``): ``"raw"`` (default;
``rawhttp``: asyncio Protocol + httptools, keep-alive pool, SSE parsed in ``data_received``) and
``"aiohttp"``; or the OpenAI SDK as the client (``LoadSpec.client``, ``sdkclient``).

Arrivals follow an absolute, precomputed schedule (``schedule.poisson_schedule`` by default): request
*i* is due at ``start + offset[i]`` whatever happened to earlier requests (open loop). A cap
(``LoadSpec.max_concurrency``, by default sized from the plan: ``LoadSpec.cap``) bounds the logical
requests in flight; a request due while the cap is full is never delayed and never dropped: it is
recorded as ``not_sent`` with the number in flight (``inflight.not_sent_record``), and the
schedule goes on. Each record keeps ``intended_at`` (schedule) beside ``sent_at`` (actual), so the
client's own lateness stays visible (coordinated omission, ``docs/definitions.md``, "Send time").

Every attempt produces one record (``docs/contracts.md`` section 3), written as soon as it
finishes. The transport never retries: ``send_attempt`` performs exactly one HTTP attempt (aiohttp's
own reconnect-and-resend of idempotent requests is switched off too). Retries belong to the
framework's policy in ``run_load`` (``LoadSpec.retry_attempts``, ``retry_backoff_s``,
``attempt_timeout_s``, ``retry_on``): a failed attempt whose error class is in ``retry_on`` is sent
again with the same ``request_id`` and ``attempt + 1`` after an exponential backoff
(``retry_backoff_s * 2**(n-1)`` before retry *n*, times a seeded jitter factor in [0.8, 1.2]), up to
``retry_attempts`` attempts in all. Each attempt is its own record; ``final`` is true on the attempt
that ended the logical request (success, a class not in ``retry_on``, or the last attempt allowed).

Rate profiles: ``LoadSpec.profile``; what a run sends and counts: :mod:`.spec` (re-exported).

Error classes (contracts.md section 3):

* ``connect``: TCP connection refused / unreachable / DNS failure; ``timeout_connect``: TCP
  connect not done within ``connect_timeout_s``.
* ``timeout_ttft``: no output-bearing chunk within ``ttft_timeout_s`` of ``sent_at``;
  ``timeout_idle``: after the first token, none for ``idle_timeout_s``.
* ``timeout_total``: the attempt exceeded ``timeout_s`` end to end.
* ``http_429``, ``http_4xx`` (also any other non-2xx, non-5xx status), ``http_5xx``.
* ``reset``: the connection was closed or reset after it was established (before or during the
  body) without a complete reply.
* ``stream_error``, ``garbled``, ``empty``, ``truncated``: from ``sse.StreamParser.classify``.
  An HTTP response aiohttp cannot parse at all counts as ``garbled``.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from chaoslib_infer.measure import chunkpath

from .attempts import (
    AFTER_DONE_GRACE_S,
    CUT_OFF,
    ERROR_CLASSES,
    MAX_ERROR_BODY,
    TIMEOUT_CLASSES,
    Deadline,
    chunk_deadline,
    exc_msg,
    finish_attempt,
    first_deadline,
    http_error,
)
from .clientside import client_cpu, cpu_reading, raise_fd_limit
from .inflight import INFLIGHT_FILE as INFLIGHT_FILE
from .inflight import cut_off_record as cut_off_record
from .inflight import not_sent_record
from .inflight import write_inflight as write_inflight
from .kerneltime import session_summary
from .records import RecordWriter, perf_to_unix
from .sdkclient import describe_client, write_prior_attempts
from .spec import DEFAULT_RETRY_ON as DEFAULT_RETRY_ON
from .spec import RETRY_JITTER as RETRY_JITTER
from .spec import LoadCounters as LoadCounters
from .spec import LoadSpec as LoadSpec
from .spec import build_body as build_body
from .spec import endpoint_url as endpoint_url
from .spec import logical_request_id as logical_request_id
from .spec import retry_backoff_delay as retry_backoff_delay

if TYPE_CHECKING:
    from .rawhttp import RawSession

__all__ = [
    "CUT_OFF",
    "INFLIGHT_FILE",
    "cut_off_record",
    "write_inflight",
    "DEFAULT_RETRY_ON",
    "ERROR_CLASSES",
    "TIMEOUT_CLASSES",
    "LoadCounters",
    "LoadSpec",
    "build_body",
    "endpoint_url",
    "make_session",
    "retry_backoff_delay",
    "run_load",
    "new_loop",
    "run_load_blocking",
    "send_attempt",
]

log = logging.getLogger(__name__)


def make_session(spec: LoadSpec) -> aiohttp.ClientSession | RawSession:
    """An aiohttp session for ``spec``: no connection limit (the run caps concurrency), no
    redirects, no proxies from the environment, connect timeout ``spec.connect_timeout_s``; all
    other timeouts are enforced by ``send_attempt``. Must be created inside a running loop.
    With ``spec.transport == "raw"``: a ``rawhttp.RawSession`` with the same behaviour."""
    if spec.client == "openai-sdk":
        from .sdkclient import SdkSession

        return SdkSession(spec)  # type: ignore[return-value]
    if spec.transport == "raw":
        from .rawhttp import RawSession

        return RawSession(spec)
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=spec.connect_timeout_s)
    session = aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        trust_env=False,
        raise_for_status=False,
        headers={"Accept": "text/event-stream", "Content-Type": "application/json"},
    )
    # aiohttp resends idempotent requests once on a dead keep-alive connection; POST is not among
    # them, but retries are the framework's (``run_load``), so switch it off outright.
    if hasattr(session, "_retry_connection"):
        session._retry_connection = False
    return session


async def send_attempt(
    session: aiohttp.ClientSession | RawSession,
    spec: LoadSpec,
    body: bytes,
    request_id: str,
    attempt: int = 1,
    intended_at: float | None = None,
    url: str | None = None,
) -> dict[str, Any]:
    """Perform exactly one streaming HTTP attempt and return its record (never raises for
    service-side failures; ``asyncio.CancelledError`` propagates and produces no record).

    Args:
        session: from ``make_session`` (a ``RawSession`` goes to ``rawhttp.send_attempt_raw``).
        spec: timeouts, headers.
        body: JSON request body (bytes).
        request_id: the logical request id, sent as ``X-Request-Id``; retries reuse it.
        attempt: attempt number of this logical request, 1-based.
        intended_at: scheduled send time, unix seconds (default: the actual send time).
        url: endpoint URL (default ``endpoint_url(spec)``).

    Returns:
        The record dict of contracts.md section 3; times in unix seconds. ``final`` is True (a lone
        attempt ends its logical request); the retry policy of ``run_load`` sets it.
    """
    if hasattr(session, "send_attempt"):  # the OpenAI SDK: its retries as prior_attempts
        return dict(await session.send_attempt(spec, body, request_id, attempt, intended_at))
    if not isinstance(session, aiohttp.ClientSession):
        from .rawhttp import send_attempt_raw

        return await send_attempt_raw(
            session, spec, body, request_id, attempt, intended_at, url or endpoint_url(spec)
        )
    loop = asyncio.get_running_loop()
    pc = time.perf_counter
    headers = {"X-Request-Id": request_id}
    if spec.headers:
        headers.update(spec.headers)
        headers["X-Request-Id"] = request_id
    if spec.idempotency_header:  # the same key on every attempt of the logical request
        headers[spec.idempotency_header] = request_id
    parser = chunkpath.parser_class()()
    status: int | None = None
    replica: str | None = None
    first_byte: float | None = None
    first_token: float | None = None
    chunk_times: list[float] = []
    err_class: str | None = None
    err: str | None = None
    done_at: float | None = None
    after_done = False

    sent = pc()
    total_dl, kind, dl = first_deadline(spec, sent)
    idle = spec.idle_timeout_s

    deadline = Deadline(loop, dl)
    timed_out = False
    try:
        try:
            try:
                async with session.post(
                    url or endpoint_url(spec), data=body, headers=headers, allow_redirects=False
                ) as resp:
                    first_byte = pc()
                    status = resp.status
                    replica = resp.headers.get("X-Replica-Id") or resp.headers.get("X-Lab-Server")
                    if not 200 <= status < 300:
                        raw = await resp.content.read(MAX_ERROR_BODY)
                        err_class, err = http_error(status, raw.decode("utf-8", "replace"))
                    else:
                        async for data in resp.content.iter_any():
                            n = parser.feed(data)
                            if n:
                                now = pc()
                                if first_token is None:
                                    first_token = now
                                chunk_times.extend([now] * n)
                                moved = chunk_deadline(kind, now, idle, total_dl)
                                if moved is not None:
                                    kind, dl = moved
                                    deadline.move(dl)
                            if parser.done and done_at is None:
                                done_at = pc()
                                kind, dl = "done", min(done_at + AFTER_DONE_GRACE_S, total_dl)
                                deadline.move(dl)
                        parser.close()
                        err_class, err = parser.classify()
            except aiohttp.ConnectionTimeoutError as exc:
                err_class, err = "timeout_connect", exc_msg(exc)
            except aiohttp.ClientConnectorError as exc:
                err_class, err = "connect", exc_msg(exc)
            except aiohttp.ClientResponseError as exc:
                err_class, err = "garbled", "invalid HTTP response: " + exc_msg(exc)
            except (aiohttp.ClientError, OSError) as exc:
                err_class, err = "reset", exc_msg(exc)
                after_done = done_at is not None
        finally:
            expired = deadline.close()
    except asyncio.CancelledError:
        if not expired:
            raise  # cancelled by the caller, not by our deadline: no record
        timed_out = True
    return finish_attempt(
        spec, parser, request_id=request_id, attempt=attempt, intended_at=intended_at,
        sent=sent, end=pc(), status=status, replica=replica, err_class=err_class, err=err,
        timed_out=timed_out, kind=kind, after_done=after_done, done_at=done_at,
        first_byte=first_byte, first_token=first_token, chunk_times=chunk_times, body=body,
    )  # fmt: skip


async def run_load(
    spec: LoadSpec,
    writer: RecordWriter,
    stop: asyncio.Event | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    progress_interval_s: float = 5.0,
    inflight_path: str | os.PathLike[str] | None = None,
    inflight_interval_s: float = 0.25,
) -> dict[str, Any]:
    """Run one open-loop load phase and write one record per finished attempt.

    Open loop: every request is due at its scheduled time. One due while ``spec.cap()`` logical
    requests are in flight is not sent: it gets a ``not_sent`` record at once (with the number in
    flight, ``inflight.not_sent_record``; counted ``not_sent``, never retried) and the schedule
    goes on. Sending stops at the end of the schedule (``spec.duration_s``). In-flight logical
    requests get their own timeouts and retries (at most ``spec.max_logical_s()``); the run
    returns at the latest about ``duration_s + max_logical_s() + 2`` seconds after it started.

    Retry policy (module docstring): a failed attempt whose ``error_class`` is in
    ``spec.retry_on`` and that is not the ``spec.retry_attempts``-th is written with
    ``final: false`` and sent again after ``retry_backoff_delay``; the retry's ``intended_at`` is
    the end of its backoff. All other attempts are written with ``final: true``.

    When ``stop`` is set: no new attempt starts, in-flight attempts (and backoffs) are cancelled
    and each attempt that was on the wire gets a record of class ``cut_off`` (``ok`` false,
    ``cut_off`` true, ``in_flight_s``: how long it had been in flight; outcome unknown, so the
    rates leave it out and count it, never a silent drop); counted ``cancelled`` in the summary.
    Every finished attempt is already on disk; a logical request cut during a backoff has no
    ``final`` record (``metrics.logical_stats`` then takes its last attempt).

    With ``inflight_path``, a JSON snapshot of the attempts on the wire is replaced atomically
    every ``inflight_interval_s`` seconds: ``{"t": unix s, "attempts": [{"request_id",
    "attempt", "intended_at", "sent_at"}]}`` (unix seconds), so a judge can see a request that
    hangs before the client's own timeout ends it (``chaoslib_infer.measure.inflight``).

    Args:
        spec: what to send.
        writer: where records go (one ``write`` per attempt).
        stop: optional event that ends the run early.
        on_progress: called with ``LoadCounters.snapshot()`` plus ``"t"`` (seconds since start)
            every ``progress_interval_s`` seconds.
        progress_interval_s: seconds between progress callbacks.
        inflight_path: where the in-flight snapshot goes (None: not written).
        inflight_interval_s: seconds between snapshots.

    Returns:
        Summary: ``run_id, url, scheduled, sent (logical requests), not_sent (due while the cap
        was full), attempts, retries, retried_requests, succeeded_after_retry, ok, failed
        (attempts), logical_ok, logical_failed, cancelled, client_errors (attempts that crashed
        inside the client: logged, not recorded), max_send_lag_s (the scheduler's own lateness),
        max_concurrency (the cap in force), cap_source (``"plan"``: sized by ``LoadSpec.cap``;
        ``"given"``), max_in_flight, cap_fill (max_in_flight / cap), errors_by_class (attempts),
        started_at, ended_at (unix s), elapsed_s, sent_rps, ok_rps, stopped, retry (the policy:
        ``{"attempts", "backoff_s", "attempt_timeout_s", "retry_on"}``), phases`` where
        ``phases`` is ``[{"index", "start_s", "end_s", "duration_s", "rate_rps", "start_at",
        "end_at" (unix s), "scheduled", "sent", "not_sent"}]`` (one phase without a profile); the
        client's CPU (``clientside.client_cpu``: ``client_cpu_s``, ``client_cpu_share``,
        ``client_runq_wait_s``, ``client_runq_wait_share``); and the clock figures of
        ``kerneltime.session_summary``: ``time_source``, ``kernel_attempts``, ``loop_attempts``,
        ``p50_client_lag_s``, ``p99_client_lag_s``, ``max_client_lag_s``, ``client_lag_reads``
        (the client's own lag, kernel stamp to handling; None without stamps); ``chunk_path``
        (``"compiled"`` | ``"python"``: the stream parser every attempt used,
        ``measure.chunkpath``).

    Raises:
        OSError / ValueError: writing a record failed (the run is stopped first).
        ValueError: ``CHAOS_INFER_CHUNK_PATH`` is bad, or ``compiled`` and not built.
    """
    chunk_path = chunkpath.path()  # a bad CHAOS_INFER_CHUNK_PATH stops the run before traffic
    chunk_path = "python" if spec.client == "openai-sdk" else chunk_path  # sdkclient: pure
    offsets = spec.offsets()
    url = endpoint_url(spec)
    rng = random.Random(spec.seed)
    run_id = os.urandom(4).hex()
    counters = LoadCounters(scheduled=len(offsets))
    cap = spec.cap(offsets)
    raise_fd_limit(cap + 256)  # a socket per request in flight, and the process's own files
    tasks: set[asyncio.Task[None]] = set()
    write_error: list[BaseException] = []
    stop_ev = stop if stop is not None else asyncio.Event()
    internal_stop = asyncio.Event()
    pc = time.perf_counter

    retry_on = frozenset(spec.retry_on)
    #: attempts on the wire: (request id, attempt) -> (intended_at, sent_at), unix seconds
    on_wire: dict[tuple[str, int], tuple[float, float]] = {}

    def write(rec: dict[str, Any]) -> bool:
        """Write ``rec``; False when the writer failed (disk full, closed): the error is kept for
        the caller and the run stops."""
        try:
            writer.write(rec)
        except BaseException as exc:
            write_error.append(exc)
            internal_stop.set()
            return False
        return True

    async def one(i: int, body: bytes, intended_at: float) -> None:
        request_id = logical_request_id(run_id, i)
        jitter_rng: random.Random | None = None
        due = intended_at
        try:
            for n in range(1, spec.retry_attempts + 1):
                counters.attempts += 1
                if n > 1:
                    counters.retries += 1
                on_wire[(request_id, n)] = (due, time.time())
                try:
                    rec = await send_attempt(session, spec, body, request_id, n, due, url=url)
                except Exception:  # a client bug, not a service failure: no record, but counted
                    log.exception("load client: attempt %d of request %d crashed", n, i)
                    counters.client_errors += 1
                    on_wire.pop((request_id, n), None)
                    return
                on_wire.pop((request_id, n), None)
                if "prior_attempts" in rec and not write_prior_attempts(rec, write, counters):
                    return
                retry = not rec["ok"] and n < spec.retry_attempts and rec["error_class"] in retry_on
                rec["final"] = not retry
                if not write(rec):
                    return
                if rec["ok"]:
                    counters.ok += 1
                else:
                    counters.failed += 1
                    ec = rec["error_class"]
                    counters.errors_by_class[ec] = counters.errors_by_class.get(ec, 0) + 1
                if not retry:
                    if rec["ok"]:
                        counters.logical_ok += 1
                        if n > 1:
                            counters.succeeded_after_retry += 1
                    else:
                        counters.logical_failed += 1
                    return
                if n == 1:
                    counters.retried_requests += 1
                if jitter_rng is None:  # per request: jitter independent of completion order
                    jitter_rng = random.Random(f"{spec.seed}:retry:{i}")
                retry_at = pc() + retry_backoff_delay(spec, n, jitter_rng, rec.get("retry_after_s"))
                delay = retry_at - pc()
                while delay > 0:
                    await asyncio.sleep(delay)
                    delay = retry_at - pc()
                due = perf_to_unix(retry_at)
        finally:
            counters.in_flight -= 1

    start = pc() + 0.02

    phases = spec.phases()
    phase_starts = [p["start_s"] for p in phases]
    phase_sent = [0] * len(phases)
    phase_not_sent = [0] * len(phases)
    phase_scheduled = [0] * len(phases)
    for off in offsets:
        phase_scheduled[max(0, bisect.bisect_right(phase_starts, off) - 1)] += 1

    async def scheduler() -> None:
        for i, off in enumerate(offsets):
            due = start + off
            delay = due - pc()
            while delay > 0:  # loop timers may fire up to ~1 ms early
                await asyncio.sleep(delay)
                delay = due - pc()
            now = pc()
            lag = now - due
            if lag > counters.max_send_lag_s:
                counters.max_send_lag_s = lag
            body = build_body(spec, rng)  # also when not sent: the prompts keep their order
            phase = max(0, bisect.bisect_right(phase_starts, off) - 1)
            if counters.in_flight >= cap:  # due now, no slot: recorded, never delayed or dropped
                counters.not_sent += 1
                phase_not_sent[phase] += 1
                rec = not_sent_record(
                    logical_request_id(run_id, i),
                    perf_to_unix(due),
                    perf_to_unix(now),
                    counters.in_flight,
                    cap,
                )
                if not write(rec):
                    return
                continue
            payload = _dumps(body)
            counters.sent += 1
            phase_sent[phase] += 1
            counters.in_flight += 1
            counters.max_in_flight = max(counters.max_in_flight, counters.in_flight)
            t = asyncio.create_task(one(i, payload, perf_to_unix(due)))
            tasks.add(t)
            t.add_done_callback(tasks.discard)

    async def progress() -> None:
        while True:
            await asyncio.sleep(progress_interval_s)
            if on_progress is not None:
                snap = counters.snapshot()
                snap["t"] = round(pc() - start, 3)
                on_progress(snap)

    async def snapshots(path: Path) -> None:
        while True:
            with contextlib.suppress(OSError):  # a full disk must not stop the load
                write_inflight(path, on_wire)
            await asyncio.sleep(inflight_interval_s)

    stopped = False
    started_at = perf_to_unix(start)
    cpu_start = cpu_reading()
    async with make_session(spec) as session:
        sched = asyncio.create_task(scheduler())
        stop_wait = asyncio.create_task(stop_ev.wait())
        istop_wait = asyncio.create_task(internal_stop.wait())
        prog = asyncio.create_task(progress()) if on_progress is not None else None
        snap_task = asyncio.create_task(snapshots(Path(inflight_path))) if inflight_path else None
        try:
            await asyncio.wait({sched, stop_wait, istop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if sched.done() and not (stop_ev.is_set() or internal_stop.is_set()):
                sched.result()
                if tasks:
                    drain = asyncio.create_task(asyncio.wait(set(tasks)))
                    await asyncio.wait(
                        {drain, stop_wait, istop_wait},
                        timeout=spec.max_logical_s() + 2.0,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    drain.cancel()
            stopped = stop_ev.is_set()
        finally:
            for t in (sched, stop_wait, istop_wait, prog, snap_task):
                if t is not None:
                    t.cancel()
            pending = [t for t in tasks if not t.done()]
            counters.cancelled = len(pending)
            cut_at = time.time()
            cut = dict(on_wire)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            if not write_error:
                for (rid, n), (due, sent) in sorted(cut.items(), key=lambda kv: kv[1][1]):
                    try:
                        writer.write(cut_off_record(rid, n, due, sent, cut_at))
                    except BaseException as exc:  # disk full: report it below
                        write_error.append(exc)
                        break
            if snap_task is not None:
                await asyncio.gather(snap_task, return_exceptions=True)
                with contextlib.suppress(OSError):
                    write_inflight(Path(inflight_path), {})  # type: ignore[arg-type]
            await asyncio.gather(sched, stop_wait, istop_wait, return_exceptions=True)
            if prog is not None:
                await asyncio.gather(prog, return_exceptions=True)
        timing = session_summary(session)
    if write_error:
        raise write_error[0]
    ended = pc()
    elapsed = max(ended - start, 1e-9)
    cpu = client_cpu(cpu_start, cpu_reading(), elapsed)
    summary = counters.snapshot()
    summary.pop("in_flight", None)
    summary.update(
        run_id=run_id,
        url=url,
        started_at=started_at,
        ended_at=perf_to_unix(ended),
        elapsed_s=round(elapsed, 3),
        sent_rps=round(counters.sent / elapsed, 3),
        ok_rps=round(counters.ok / elapsed, 3),
        max_send_lag_s=round(counters.max_send_lag_s, 6),
        max_concurrency=cap,
        cap_source="given" if spec.max_concurrency is not None else "plan",
        cap_fill=round(counters.max_in_flight / cap, 4),
        stopped=stopped,
        client=describe_client(spec, session),
        retry={
            "attempts": spec.retry_attempts,
            "backoff_s": spec.retry_backoff_s,
            "attempt_timeout_s": spec.attempt_timeout,
            "retry_on": list(spec.retry_on),
        },
        phases=[
            {
                **p,
                "start_at": started_at + p["start_s"],
                "end_at": started_at + p["end_s"],
                "scheduled": phase_scheduled[k],
                "sent": phase_sent[k],
                "not_sent": phase_not_sent[k],
            }
            for k, p in enumerate(phases)
        ],
        **cpu,
        **timing,
        chunk_path=chunk_path,
    )
    return summary


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def new_loop() -> asyncio.AbstractEventLoop:
    """A fresh event loop for a load run: uvloop's when it is installed (a dependency on POSIX;
    it roughly halves the client's CPU per request), else asyncio's default."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def run_load_blocking(spec: LoadSpec, out_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Run ``run_load`` to completion on a fresh (uvloop when available) event loop.

    Args:
        spec: what to send.
        out_path: records file (JSONL), truncated first.

    Returns:
        The ``run_load`` summary plus ``"out"`` (the path as a string).

    Raises:
        OSError: the records file cannot be written.
        RuntimeError: called from a thread that already runs an event loop.
    """

    async def main() -> dict[str, Any]:
        with RecordWriter(out_path) as writer:
            return await run_load(spec, writer)

    with asyncio.Runner(loop_factory=new_loop) as runner:
        summary = runner.run(main())
    summary["out"] = str(out_path)
    return summary
