"""What one load run sends and counts: :class:`LoadSpec` (targets, rates, timeouts, retries, prompts),
:class:`LoadCounters`, and the request shaping both transports share (:func:`endpoint_url`,
:func:`build_body`, :func:`retry_backoff_delay`, :func:`logical_request_id`).

Split out of :mod:`chaoslib_infer.load.client`, which re-exports every name here (import paths
kept); the sending (``send_attempt``, ``run_load``) stays there.
"""

from __future__ import annotations

import math
import random
import secrets
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from .attempts import AFTER_DONE_GRACE_S, ERROR_CLASSES
from .mix import PROMPT_WORDS, PromptClass, parse_prompt_mix
from .mix import draw as draw_prompt_class
from .schedule import (
    check_profile,
    constant_schedule,
    poisson_schedule,
    profile_phases,
    profile_schedule,
)

if TYPE_CHECKING:
    from .trace import TraceRequest

__all__ = [
    "DEFAULT_RETRY_ON",
    "RETRY_JITTER",
    "SDK_MAX_WAIT_S",
    "LoadCounters",
    "LoadSpec",
    "build_body",
    "endpoint_url",
    "logical_request_id",
    "retry_backoff_delay",
]

#: Error classes retried by default (transport failures, timeouts, 5xx and 429; never 4xx or a
#: malformed reply, which a retry would most likely only repeat).
DEFAULT_RETRY_ON: tuple[str, ...] = (
    "connect",
    "timeout_connect",
    "timeout_ttft",
    "timeout_idle",
    "timeout_total",
    "reset",
    "http_5xx",
    "http_429",
)
#: Relative jitter of a retry backoff: the delay is multiplied by a factor in [1 - J, 1 + J].
RETRY_JITTER = 0.2
#: The longest wait the OpenAI SDK makes before a retry (a ``Retry-After`` it honours, openai 3.60
#: ``MAX_RETRY_AFTER_DELAY``), seconds: the bound of ``LoadSpec.max_logical_s`` with the SDK.
SDK_MAX_WAIT_S = 120.0


@dataclass
class LoadSpec:
    """What to send, how fast, and the client's timeouts. Times in seconds.

    Attributes:
        url: base URL of the service, e.g. ``http://127.0.0.1:8800`` (a trailing ``/v1`` is
            accepted); the path ``/v1/chat/completions`` or ``/v1/completions`` is appended.
        api: ``"chat"`` or ``"completions"``.
        model: model name sent in the body.
        rate_rps: mean arrival rate, requests per second (with ``profile``: set to the profile's
            time-weighted mean rate).
        duration_s: length of the arrival schedule; no logical request starts after it (its
            retries may). With ``profile``: set to the profile's total duration.
        max_concurrency: cap on in-flight logical requests (a request keeps its slot through
            its retries and backoffs). A request due while the cap is full is not sent and is
            recorded ``not_sent`` (``inflight.not_sent_record``); the schedule never waits.
            None (default): sized from the plan, the most arrivals of any stretch of the
            schedule one request's deadline (``max_logical_s``) long, at least 1000
            (``inflight.plan_cap``); :meth:`cap` gives it.
        max_tokens: ``max_tokens`` in the body.
        prompt_words: words after the nonce in each prompt (unless ``prompt_mix`` is set).
        prompt_mix: prompt-length mixture (``mix.parse_prompt_mix``: a tuple of
            ``mix.PromptClass``); each logical request draws a class by weight with the seeded
            RNG, which sets its prompt words (and, for a named class, its ``max_tokens``). None:
            every prompt has ``prompt_words`` words.
        timeout_s: total time limit of one attempt (``timeout_total``) unless
            ``attempt_timeout_s`` is set.
        connect_timeout_s: TCP connect limit (``timeout_connect``).
        ttft_timeout_s: limit from send to first output chunk (``timeout_ttft``); None = no limit.
        idle_timeout_s: limit between output chunks (``timeout_idle``); None = no limit.
        seed: seed of the arrival schedule and prompt words (nonces are always random).
        headers: extra request headers (e.g. Authorization).
        include_usage: send ``stream_options: {"include_usage": true}`` (some providers reject it).
        arrival: ``"poisson"`` or ``"constant"`` inter-arrival gaps.
        extra_body: extra JSON fields merged into every request body (per-target options).
        retry_attempts: total attempts per logical request (1 = no retry).
        retry_backoff_s: base backoff; retry *n* (attempt *n + 1*) waits
            ``retry_backoff_s * 2**(n-1)`` seconds after attempt *n* ended, times a jitter factor
            uniform in [0.8, 1.2] from an RNG seeded with ``seed`` and the request index.
        attempt_timeout_s: total time limit of each attempt (``timeout_total``); None =
            ``timeout_s``.
        retry_on: error classes that trigger a retry (default ``DEFAULT_RETRY_ON``); each must be
            in ``ERROR_CLASSES``.
        retry_after_max_s: honour a ``Retry-After`` the failed attempt's answer carried (the
            record's ``retry_after_s``) up to this many seconds: the retry waits the longer of
            its backoff and ``min(Retry-After, retry_after_max_s)``. None (default): our client
            ignores ``Retry-After`` and waits its backoff alone.
        profile: consecutive ``(duration_s, rate_rps)`` phases; when given it defines the
            schedule (``schedule.profile_schedule``), ``duration_s`` and ``rate_rps``.
        trace: path of a recorded trace (``trace.read_trace``: Mooncake / AIPerf JSONL); when
            given it defines the schedule (its timestamps), ``duration_s``, ``rate_rps`` and each
            request's prompt and ``max_tokens`` (``build_body``, in schedule order).
        trace_speed: time scale of the trace (2 = twice as fast).
        transport: ``"raw"`` (default; ``rawhttp``: asyncio Protocol + httptools, less client
            CPU per request, chunk times taken as the bytes arrive) or ``"aiohttp"``; same
            records and error classes.
        client: who sends the requests: ``"raw"`` (default: our client, over ``transport``,
            the one whose chunk times are kernel-stamped) or ``"openai-sdk"`` (the official
            ``openai`` package's ``AsyncOpenAI``, streaming chat completions under its own retry
            and timeout policy, every SDK retry its own record: ``sdkclient``). With the SDK
            the SDK owns the retries: ``retry_attempts`` must stay 1 and ``api`` ``chat``.
        sdk_max_retries: the SDK's ``max_retries`` (None: its default, 2).
        sdk_timeout_s: the SDK's read/write timeout, seconds, connect ``connect_timeout_s``
            (None: its default, 600 s, connect 5 s).

    Raises:
        ValueError: from ``__post_init__`` on an invalid value (one-line message).
    """

    url: str
    api: Literal["chat", "completions"] = "chat"
    model: str = "sim"
    rate_rps: float = 10.0
    duration_s: float = 10.0
    max_concurrency: int | None = None
    max_tokens: int = 32
    prompt_words: int = 16
    prompt_mix: tuple[PromptClass, ...] | None = None
    timeout_s: float = 30.0
    connect_timeout_s: float = 3.0
    ttft_timeout_s: float | None = 10.0
    idle_timeout_s: float | None = 5.0
    seed: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    include_usage: bool = True
    arrival: Literal["poisson", "constant"] = "poisson"
    extra_body: dict[str, Any] = field(default_factory=dict)
    retry_attempts: int = 1
    retry_backoff_s: float = 0.2
    attempt_timeout_s: float | None = None
    retry_on: tuple[str, ...] = DEFAULT_RETRY_ON
    retry_after_max_s: float | None = None
    profile: list[tuple[float, float]] | None = None
    transport: Literal["aiohttp", "raw"] = "raw"
    client: Literal["raw", "openai-sdk"] = "raw"
    sdk_max_retries: int | None = None
    sdk_timeout_s: float | None = None
    trace: str | None = None
    trace_speed: float = 1.0
    _trace: list[Any] = field(default_factory=list, init=False, repr=False, compare=False)
    _trace_next: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"url must be http(s)://host:port, got {self.url!r}")
        if self.api not in ("chat", "completions"):
            raise ValueError(f"api must be 'chat' or 'completions', got {self.api!r}")
        if self.arrival not in ("poisson", "constant"):
            raise ValueError(f"arrival must be 'poisson' or 'constant', got {self.arrival!r}")
        if self.transport not in ("aiohttp", "raw"):
            raise ValueError(f"transport must be 'aiohttp' or 'raw', got {self.transport!r}")
        if self.client not in ("raw", "openai-sdk"):
            raise ValueError(f"client must be 'raw' or 'openai-sdk', got {self.client!r}")

        def pos(
            name: str, v: float | None, allow_none: bool = False, allow_zero: bool = False
        ) -> None:
            if v is None and allow_none:
                return
            ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or v is None or v < 0 or (v == 0 and not allow_zero):
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")

        if self.profile is not None:
            self.profile = check_profile(self.profile)
            total = sum(d for d, _ in self.profile)
            self.duration_s = total
            self.rate_rps = sum(d * r for d, r in self.profile) / total
        if self.trace is not None:
            from .trace import read_trace, trace_offsets

            if self.profile is not None:
                raise ValueError("give a rate profile or a trace, not both")

            self._trace = read_trace(self.trace)
            self.duration_s = trace_offsets(self._trace, self.trace_speed)[-1] + 1e-3
            self.rate_rps = len(self._trace) / self.duration_s
        pos("rate_rps", self.rate_rps)
        pos("duration_s", self.duration_s)
        pos("timeout_s", self.timeout_s)
        pos("attempt_timeout_s", self.attempt_timeout_s, allow_none=True)
        pos("retry_backoff_s", self.retry_backoff_s, allow_zero=True)
        pos("retry_after_max_s", self.retry_after_max_s, allow_none=True, allow_zero=True)
        ra = self.retry_attempts
        if not isinstance(ra, int) or isinstance(ra, bool) or ra < 1:
            raise ValueError(f"retry_attempts must be an integer >= 1, got {ra!r}")
        if isinstance(self.retry_on, str) or not isinstance(self.retry_on, list | tuple | set):
            raise ValueError(f"retry_on must be a list of error classes, got {self.retry_on!r}")
        bad = [c for c in self.retry_on if c not in ERROR_CLASSES]
        if bad:
            raise ValueError(
                f"retry_on: unknown error class {bad[0]!r} (known: {', '.join(ERROR_CLASSES)})"
            )
        self.retry_on = tuple(dict.fromkeys(self.retry_on))
        pos("connect_timeout_s", self.connect_timeout_s)
        pos("ttft_timeout_s", self.ttft_timeout_s, allow_none=True)
        pos("idle_timeout_s", self.idle_timeout_s, allow_none=True)
        for name in ("max_concurrency", "max_tokens"):
            v = getattr(self, name)
            if v is None and name == "max_concurrency":
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.prompt_words, int) or self.prompt_words < 0:
            raise ValueError(f"prompt_words must be an integer >= 0, got {self.prompt_words!r}")
        if self.prompt_mix is not None:
            self.prompt_mix = parse_prompt_mix(self.prompt_mix)
        self._check_sdk()

    def _check_sdk(self) -> None:
        """Validate the OpenAI SDK client's options (``client``, ``sdk_*``).

        Raises:
            ValueError: one line naming the option.
        """
        mr = self.sdk_max_retries
        if mr is not None and (not isinstance(mr, int) or isinstance(mr, bool) or mr < 0):
            raise ValueError(f"sdk_max_retries must be an integer >= 0, got {mr!r}")
        t = self.sdk_timeout_s
        if t is not None and (
            not isinstance(t, int | float) or isinstance(t, bool) or not 0 < t < math.inf
        ):
            raise ValueError(f"sdk_timeout_s must be a finite number > 0, got {t!r}")
        if self.client != "openai-sdk":
            if mr is not None or t is not None:
                raise ValueError("sdk_max_retries / sdk_timeout_s need client: openai-sdk")
            return
        if self.retry_attempts != 1:
            raise ValueError(
                "client openai-sdk retries by itself: set sdk_max_retries, not retry_attempts"
            )
        if self.api != "chat":
            raise ValueError("client openai-sdk sends chat completions only (api: chat)")
        try:  # imported here, not in the run: the import (~1 s) would be schedule lag
            import openai  # noqa: F401
        except ImportError:
            raise ValueError(
                "client openai-sdk needs the openai package: pip install openai"
            ) from None

    @property
    def trace_requests(self) -> list[TraceRequest]:
        """The requests of ``trace`` as read by ``trace.read_trace`` when the spec was built, in
        file order (empty without a trace). The spec's own list: do not modify it."""
        return self._trace

    @property
    def attempt_timeout(self) -> float:
        """Effective total time limit of one attempt in seconds (``attempt_timeout_s`` or
        ``timeout_s``)."""
        return self.attempt_timeout_s if self.attempt_timeout_s is not None else self.timeout_s

    def max_logical_s(self) -> float:
        """Upper bound in seconds of one logical request: every attempt at its timeout plus every
        backoff at its maximum jitter (the drain bound of ``run_load``)."""
        if self.client == "openai-sdk":  # the SDK's: each try at its timeout, each backoff
            tries = (2 if self.sdk_max_retries is None else self.sdk_max_retries) + 1
            timeout = 600.0 if self.sdk_timeout_s is None else self.sdk_timeout_s
            return tries * (timeout + self.connect_timeout_s) + (tries - 1) * SDK_MAX_WAIT_S
        backoffs = sum(
            max(
                self.retry_backoff_s * 2 ** (n - 1) * (1 + RETRY_JITTER),
                self.retry_after_max_s or 0,
            )
            for n in range(1, self.retry_attempts)
        )
        return self.retry_attempts * (self.attempt_timeout + AFTER_DONE_GRACE_S) + backoffs

    def cap(self, offsets: list[float] | None = None) -> int:
        """The in-flight cap of a run: ``max_concurrency``, or when None the plan's
        (``inflight.plan_cap`` over ``offsets``, default :meth:`offsets`, and
        :meth:`max_logical_s`)."""
        if self.max_concurrency is not None:
            return self.max_concurrency
        from .inflight import plan_cap

        return plan_cap(self.offsets() if offsets is None else offsets, self.max_logical_s())

    def phases(self) -> list[dict[str, float]]:
        """Rate phases as ``schedule.profile_phases`` rows (one phase without a profile)."""
        return profile_phases(self.profile or [(self.duration_s, self.rate_rps)])

    def offsets(self) -> list[float]:
        """The arrival schedule: offsets in seconds from the start of the run."""
        if self.trace is not None:
            from .trace import trace_offsets

            self._trace_next = 0  # a new run replays the trace's bodies from the first
            return trace_offsets(self._trace, self.trace_speed)
        if self.profile is not None:
            return profile_schedule(self.profile, self.seed, self.arrival)
        if self.arrival == "constant":
            return constant_schedule(self.rate_rps, self.duration_s)
        return poisson_schedule(self.rate_rps, self.duration_s, self.seed)


@dataclass
class LoadCounters:
    """Live counters of a run (read by progress reporting).

    ``sent`` counts logical requests started, ``attempts`` every attempt sent (``retries`` =
    ``attempts - sent`` once all have finished), ``ok``/``failed``/``errors_by_class`` count attempt
    records, ``logical_ok``/``logical_failed`` count logical requests by their final attempt.
    ``not_sent`` counts requests due while the in-flight cap was full (each a ``not_sent`` record,
    not in ``failed``), ``max_in_flight`` the most logical requests in flight at once.
    """

    scheduled: int = 0
    sent: int = 0
    ok: int = 0
    failed: int = 0
    in_flight: int = 0
    attempts: int = 0
    retries: int = 0
    retried_requests: int = 0
    succeeded_after_retry: int = 0
    logical_ok: int = 0
    logical_failed: int = 0
    not_sent: int = 0
    max_in_flight: int = 0
    cancelled: int = 0
    client_errors: int = 0
    max_send_lag_s: float = 0.0
    errors_by_class: dict[str, int] = field(default_factory=dict)

    def snapshot(self) -> dict[str, Any]:
        """JSON-able copy of the counters."""
        d = dict(self.__dict__)
        d["errors_by_class"] = dict(self.errors_by_class)
        return d


def endpoint_url(spec: LoadSpec) -> str:
    """Full URL of the streaming endpoint for ``spec.api`` (see ``LoadSpec.url``).

    A ``spec.url`` whose path already ends with ``/chat/completions`` or ``/completions`` is used
    as is (a provider whose route is not under ``/v1``, e.g. ``.../api/v3/chat/completions``).
    """
    base = spec.url.rstrip("/")
    if base.endswith(("/chat/completions", "/completions")):
        return base
    if base.endswith("/v1"):
        base = base[:-3]
    return base + ("/v1/chat/completions" if spec.api == "chat" else "/v1/completions")


def build_body(spec: LoadSpec, rng: random.Random, nonce: str | None = None) -> dict[str, Any]:
    """Request body for one logical request: a prompt starting with a random nonce, or with a
    trace, the next trace request's prompt (``trace.trace_prompt``) and ``output_length``.

    Args:
        spec: the load spec (api, model, max_tokens, prompt_words or prompt_mix, include_usage,
            extra_body).
        rng: source of the prompt words (and of the prompt class, with ``spec.prompt_mix``).
        nonce: the prompt prefix; default 16 random hex characters (never seeded, so a response
            cache cannot serve a repeated run).
    """
    if spec.trace is not None:  # the next trace request's size (schedule order)
        from .trace import trace_prompt

        req = spec._trace[spec._trace_next % len(spec._trace)]
        spec._trace_next += 1
        prompt, max_tokens = trace_prompt(req, rng), req.output_length
    else:
        nonce = nonce or secrets.token_hex(8)
        n_words, max_tokens = spec.prompt_words, spec.max_tokens
        if spec.prompt_mix:
            cls = draw_prompt_class(spec.prompt_mix, rng)
            n_words, max_tokens = cls.prompt_words, cls.max_tokens or spec.max_tokens
        words = " ".join(rng.choice(PROMPT_WORDS) for _ in range(n_words))
        prompt = f"[{nonce}] {words}".rstrip()
    body: dict[str, Any] = {"model": spec.model, "max_tokens": max_tokens, "stream": True}
    if spec.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if spec.include_usage:
        body["stream_options"] = {"include_usage": True}
    body.update(spec.extra_body)
    return body


def retry_backoff_delay(
    spec: LoadSpec, retry: int, rng: random.Random, retry_after_s: float | None = None
) -> float:
    """Seconds to wait before retry number ``retry`` (1 = the second attempt).

    ``spec.retry_backoff_s * 2**(retry - 1)`` times a factor drawn uniformly from
    ``[1 - RETRY_JITTER, 1 + RETRY_JITTER]`` (i.e. +-20%) with ``rng``; with
    ``spec.retry_after_max_s`` set and a ``retry_after_s`` (the failed answer's ``Retry-After``,
    seconds), at least ``min(retry_after_s, spec.retry_after_max_s)``.
    """
    delay = (
        spec.retry_backoff_s * 2 ** (retry - 1) * rng.uniform(1 - RETRY_JITTER, 1 + RETRY_JITTER)
    )
    if spec.retry_after_max_s is not None and retry_after_s is not None and retry_after_s > 0:
        delay = max(delay, min(retry_after_s, spec.retry_after_max_s))
    return delay


def logical_request_id(run_id: str, index: int) -> str:
    """Return the logical request id of the ``index``-th request of run ``run_id`` (8 hex digits).

    The id is a valid UUID4 string (some servers, e.g. llama-cpp-python's, answer 400 to any other
    ``X-Request-Id``) that keeps the run id in its first group and the index in its last:
    ``664c9a81-0000-4000-8000-00000000004d`` is request 77 of run ``664c9a81``.
    """
    return str(uuid.UUID(int=(int(run_id, 16) << 96) | index, version=4))
