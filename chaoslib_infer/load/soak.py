"""Realistic soak: random arrivals, a mixture of prompt lengths, schedule lag checked, constant memory.

* Arrivals: an absolute schedule of random gaps with mean ``1 / (rate * headroom)``: exponential
  (Poisson process) or gamma with shape ``K`` (``gamma:K``; coefficient of variation
  ``1/sqrt(K)``, so ``K < 1`` is burstier than Poisson, ``K > 1`` smoother). The schedule is
  generated lazily (no list of a million offsets).
* Prompt mixture (``--mix short:70,mid:25,long:5``): each request draws a class by weight; a class
  sets the prompt words and ``max_tokens`` (``MIX_CLASSES``), the prompt starts with a random
  nonce.
* Schedule lag = actual send minus intended send (from the absolute schedule), recorded in every
  record (``intended_at`` / ``sent_at``). A run whose lag P99 exceeds ``lag_p99_max_s`` is marked
  **invalid**: its latencies would hide client-side queueing (coordinated omission), so the report
  gives the reason instead of figures.
* Long runs stay small: records stream to disk as they finish, statistics come from HDR
  histograms updated as records are written, the report is rendered by streaming over the records
  file (``stream_report``); nothing keeps a per-request list in memory.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from .ceiling import check_rate
from .client import (
    TIMEOUT_CLASSES,
    LoadSpec,
    build_body,
    endpoint_url,
    make_session,
    new_loop,
    run_load_blocking,
    send_attempt,
)
from .hdrbatch import record_many
from .mix import MIX_CLASSES  # the prompt-length classes (shared with LoadSpec.prompt_mix)
from .records import RecordWriter, iter_records, perf_to_unix
from .trace import trace_summary

__all__ = [
    "MIX_CLASSES",
    "SoakSpec",
    "StreamStats",
    "arrival_gaps",
    "parse_burstiness",
    "parse_mix",
    "run_soak",
    "run_trace_soak",
    "stream_report",
]

_US = 1_000_000
_MAX_US = 3600 * _US
#: Records ``StreamStats`` buffers before it records their values in one batch: few while a run
#: is live (256 records of 64 chunks take ~5 ms of the event loop, which would show as schedule
#: lag), many when a report is computed from a file (``stream_report``: faster per record).
LIVE_FLUSH_RECORDS = 256
REPORT_FLUSH_RECORDS = 4096


def parse_mix(text: str) -> list[tuple[str, float]]:
    """Parse ``short:70,mid:25,long:5`` into ``[(class, weight)]``.

    Raises:
        ValueError: unknown class, non-positive weight, or bad syntax (one line).
    """
    out = []
    for part in text.split(","):
        name, _, w = part.strip().partition(":")
        if name not in MIX_CLASSES:
            raise ValueError(f"unknown mix class {name!r} (known: {', '.join(MIX_CLASSES)})")
        try:
            weight = float(w)
        except ValueError:
            raise ValueError(f"bad weight in mix part {part!r}") from None
        if not (weight > 0 and math.isfinite(weight)):
            raise ValueError(f"mix weight must be > 0 in {part!r}")
        out.append((name, weight))
    if not out:
        raise ValueError("empty mix")
    return out


def parse_burstiness(text: str) -> float | None:
    """``poisson`` -> None; ``gamma:K`` -> K (> 0).

    Raises:
        ValueError: anything else.
    """
    if text == "poisson":
        return None
    kind, _, k = text.partition(":")
    try:
        shape = float(k)
    except ValueError:
        shape = -1.0
    if kind != "gamma" or not (shape > 0 and math.isfinite(shape)):
        raise ValueError(f"burstiness must be 'poisson' or 'gamma:K' with K > 0, got {text!r}")
    return shape


def arrival_gaps(rate_rps: float, gamma_shape: float | None, seed: int) -> Iterator[float]:
    """Endless random inter-arrival gaps (seconds) with mean ``1 / rate_rps``.

    Args:
        rate_rps: mean rate.
        gamma_shape: None for exponential gaps (Poisson), else the gamma shape K (scale
            ``1 / (K * rate)``).
        seed: RNG seed.
    """
    rng = random.Random(seed)
    if gamma_shape is None:
        while True:
            yield rng.expovariate(rate_rps)
    scale = 1.0 / (gamma_shape * rate_rps)
    while True:
        yield rng.gammavariate(gamma_shape, scale)


def _record_many(h: HdrHistogram, seconds: np.ndarray[Any, Any]) -> None:
    """Record durations (seconds; non-finite ones skipped, clamped to [1 us, 1 h]) into ``h``.

    Equivalent to one ``record_value(round(v * 1e6))`` per value, but vectorised: each value is
    mapped to the lowest value of its HDR bucket (``unit_magnitude`` 0: a value of bit length
    ``b`` keeps its top ``sub_bucket_half_count_magnitude + 1`` bits), and each distinct bucket is
    recorded once with its count. Percentiles only depend on bucket counts, so they are identical.
    """
    v = seconds[np.isfinite(seconds)]
    if v.size:
        record_many(h, np.clip(np.rint(v * _US), 1, _MAX_US).astype(np.int64))


class StreamStats:
    """Constant-memory statistics of attempt records (HDR histograms, 1 us, 3 digits).

    Definitions as ``measure.metrics.window_stats`` (``docs/definitions.md``): rates over
    attempted requests, latency percentiles over successful ones with the censored fraction
    beside them; lag over every attempt.

    Values are buffered for at most ``flush_records`` records (and ``64 * flush_records`` chunk
    times) and recorded in one vectorised batch (``_record_many``); ``h``, ``pct`` and ``summary``
    flush first, so results are the same as recording every value at once (a million records
    take seconds, not minutes).

    Args:
        flush_records: batch size in records (``LIVE_FLUSH_RECORDS`` by default).
    """

    def __init__(self, flush_records: int = LIVE_FLUSH_RECORDS) -> None:
        self._flush_records = max(1, flush_records)
        self._flush_chunks = 64 * self._flush_records
        self._h = {k: HdrHistogram(1, _MAX_US, 3) for k in ("e2e", "ttft", "itl", "tpot", "lag")}
        self.n = self.ok = self.timeouts = 0
        self.errors: dict[str, dict[str, Any]] = {}
        self.first_sent: float | None = None
        self.last_sent: float | None = None
        self.by_class: dict[str, int] = {}
        self._buf: dict[str, list[float]] = {k: [] for k in self._h}
        self._ct: list[float] = []  # chunk times of the buffered records, concatenated
        self._ct_starts: list[int] = []  # where each record's chunk times start in ``_ct``
        self._pending = 0

    @property
    def h(self) -> dict[str, HdrHistogram]:
        """The histograms by name (``e2e, ttft, itl, tpot, lag``; 1 us units), every buffered
        value recorded first."""
        self._flush()
        return self._h

    def _rec(self, name: str, v: float) -> None:
        self._buf[name].append(v)

    def _flush(self) -> None:
        """Move every buffered value into the histograms."""
        for name, buf in self._buf.items():
            if buf:
                _record_many(self._h[name], np.asarray(buf, dtype=np.float64))
                buf.clear()
        if self._ct:
            gaps = np.diff(np.asarray(self._ct, dtype=np.float64))
            ok = np.ones(gaps.size, dtype=bool)
            ok[np.asarray(self._ct_starts[1:], dtype=np.int64) - 1] = False  # across two records
            _record_many(self._h["itl"], gaps[ok])
            self._ct.clear()
            self._ct_starts.clear()
        self._pending = 0

    def add(self, r: Mapping[str, Any], mix_class: str | None = None) -> None:
        """Account one attempt record."""
        if self._pending >= self._flush_records or len(self._ct) >= self._flush_chunks:
            self._flush()
        self._pending += 1
        self.n += 1
        sent = r["sent_at"]
        self.first_sent = sent if self.first_sent is None else min(self.first_sent, sent)
        self.last_sent = sent if self.last_sent is None else max(self.last_sent, sent)
        intended = r.get("intended_at")
        if isinstance(intended, int | float):
            self._rec("lag", max(sent - intended, 0.0))
        if mix_class:
            self.by_class[mix_class] = self.by_class.get(mix_class, 0) + 1
        if not r.get("ok"):
            cls = r.get("error_class") or "unknown"
            e = self.errors.setdefault(cls, {"count": 0, "sample": r.get("error")})
            e["count"] += 1
            if cls in TIMEOUT_CLASSES:
                self.timeouts += 1
            return
        self.ok += 1
        # timed from when it was due, as ``metrics.window_stats`` (coordinated omission corrected)
        due = intended if isinstance(intended, int | float) and intended <= sent else sent
        self._rec("e2e", r["end_at"] - due)
        ft = r.get("first_token_at")
        if isinstance(ft, int | float):
            self._rec("ttft", ft - due)
        ct = r.get("chunk_times") or []
        if len(ct) >= 2:
            self._ct_starts.append(len(self._ct))
            self._ct.extend(ct)
        toks = r.get("output_tokens") or 0
        if len(ct) >= 2 and toks > 1:
            self._rec("tpot", (ct[-1] - ct[0]) / (toks - 1))

    def pct(self, name: str, p: float) -> float | None:
        """Percentile ``p`` of histogram ``name`` in seconds, None when empty."""
        h = self.h[name]
        return h.get_value_at_percentile(p) / _US if h.get_total_count() else None

    def summary(self) -> dict[str, Any]:
        """Counts, rates over attempted, percentiles (seconds) with ``censored_fraction``."""
        n = self.n
        failed = n - self.ok
        out: dict[str, Any] = {
            "requests": n,
            "ok": self.ok,
            "failed": failed,
            "availability": self.ok / n if n else None,
            "error_rate": failed / n if n else None,
            "timeout_rate": self.timeouts / n if n else None,
            "censored_fraction": failed / n if n else None,
            "errors_by_class": self.errors,
        }
        for name, pcts in (("e2e", (50, 95, 99, 99.9)), ("ttft", (50, 99)), ("itl", (50, 99)),
                           ("tpot", (50, 99)), ("lag", (50, 99, 100))):  # fmt: skip
            for p in pcts:
                key = "max" if p == 100 else f"p{p:g}".replace(".", "")
                out[f"{key}_{name if name != 'lag' else 'send_lag'}_s"] = self.pct(name, p)
        if self.first_sent is not None and self.last_sent is not None:
            span = max(self.last_sent - self.first_sent, 1e-9)
            out["ok_rps"] = self.ok / span
        if self.by_class:
            out["mix"] = dict(self.by_class)
        return out


@dataclass
class SoakSpec:
    """Soak parameters (seconds, requests/s).

    Attributes:
        url: target base URL.
        duration_s: schedule length.
        rate_rps: mean rate at peak (multiplied by ``headroom``).
        mix: ``[(class, weight)]`` from ``parse_mix``.
        gamma_shape: None (Poisson) or the gamma shape K.
        headroom: rate multiplier (1.5 = 50% over the stated peak).
        max_concurrency: in-flight cap; arrivals wait at it (and their lag shows it).
        lag_p99_max_s: validity threshold on the send-lag P99.
        seed, model, api, timeout_s, headers: as ``LoadSpec``.
        ceiling_rps: client ceiling for the refusal rule (None: not applied).
        max_tokens_scale: multiplies every class's ``max_tokens`` (shorter streams in tests).
    """

    url: str
    duration_s: float
    rate_rps: float
    mix: list[tuple[str, float]] = field(
        default_factory=lambda: parse_mix("short:70,mid:25,long:5")
    )
    gamma_shape: float | None = None
    headroom: float = 1.0
    max_concurrency: int = 1024
    lag_p99_max_s: float = 0.05
    seed: int = 0
    model: str = "sim"
    api: str = "chat"
    timeout_s: float = 60.0
    headers: dict[str, str] = field(default_factory=dict)
    ceiling_rps: float | None = None
    max_tokens_scale: float = 1.0

    @property
    def effective_rate(self) -> float:
        """``rate_rps * headroom``."""
        return self.rate_rps * self.headroom


async def _soak(
    spec: SoakSpec, writer: RecordWriter, stats: StreamStats, log: Callable[[str], None]
) -> dict[str, Any]:
    names = [c for c, _ in spec.mix]
    weights = [w for _, w in spec.mix]
    specs = {
        c: LoadSpec(
            url=spec.url, api=spec.api, model=spec.model,  # type: ignore[arg-type]
            max_tokens=max(1, int(MIX_CLASSES[c][1] * spec.max_tokens_scale)),
            prompt_words=MIX_CLASSES[c][0], timeout_s=spec.timeout_s,
            ttft_timeout_s=spec.timeout_s, idle_timeout_s=spec.timeout_s, headers=dict(spec.headers),
        )
        for c in names
    }  # fmt: skip
    base = specs[names[0]]
    url = endpoint_url(base)
    rng = random.Random(spec.seed)
    sem = asyncio.Semaphore(spec.max_concurrency)
    tasks: set[asyncio.Task[None]] = set()
    pc = time.perf_counter
    sent = unsent = 0

    async def one(i: int, cls: str, body: bytes, intended: float) -> None:
        try:
            rec = await send_attempt(session, specs[cls], body, f"soak-{i}", 1, intended, url=url)
            writer.write(rec)
            stats.add(rec, cls)
        finally:
            sem.release()

    async with make_session(base) as session:
        # one unrecorded warm-up request per class: first-use costs (imports, connection setup,
        # prompt building) must not show up as schedule lag
        for c in names:
            body = json.dumps(build_body(specs[c], rng)).encode()
            await send_attempt(session, specs[c], body, "soak-warmup", url=url)
        start = pc() + 0.05
        end = start + spec.duration_s
        off = 0.0
        i = 0
        for gap in arrival_gaps(spec.effective_rate, spec.gamma_shape, spec.seed):
            off += gap
            due = start + off
            if due >= end:
                break
            delay = due - pc()
            while delay > 0:
                await asyncio.sleep(delay)
                delay = due - pc()
            try:
                await asyncio.wait_for(sem.acquire(), max(end - pc(), 0.001))
            except TimeoutError:
                unsent += 1
                continue
            cls = rng.choices(names, weights)[0]
            body = json.dumps(build_body(specs[cls], rng)).encode()
            t = asyncio.create_task(one(i, cls, body, perf_to_unix(due)))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            sent += 1
            i += 1
        if tasks:
            await asyncio.wait(set(tasks), timeout=spec.timeout_s + 5)
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"sent": sent, "unsent": unsent, "elapsed_s": round(pc() - start, 3)}


def run_soak(
    spec: SoakSpec, out: Path, log: Callable[[str], None] = lambda _m: None
) -> dict[str, Any]:
    """Run a soak and write ``<out>/records.jsonl`` and ``<out>/report.json``.

    Returns:
        ``{"valid", "invalid_reason", "rate_rps" (effective), "sent", "unsent", "elapsed_s",
        "lag_p99_s", "lag_p99_max_s", "stats"}``; ``stats`` (``StreamStats.summary``) is omitted
        (None) when the run is invalid.

    Raises:
        ceiling.CeilingRefused: the rate needs more than half the client ceiling.
        OSError: the output directory is not writable.
    """
    check_rate(spec.effective_rate, spec.ceiling_rps, 1, "soak")
    out.mkdir(parents=True, exist_ok=True)
    stats = StreamStats()
    with RecordWriter(out / "records.jsonl") as w:
        with asyncio.Runner(loop_factory=new_loop) as runner:
            res = runner.run(_soak(spec, w, stats, log))
    summ = stats.summary()
    lag99 = summ.get("p99_send_lag_s")
    valid = lag99 is not None and lag99 <= spec.lag_p99_max_s
    reason = None
    if not valid:
        reason = (
            "no request sent"
            if lag99 is None
            else f"schedule lag P99 {lag99 * 1000:.1f} ms > {spec.lag_p99_max_s * 1000:.1f} ms: "
            "the client could not keep the schedule"
        )
    report = {
        "valid": valid,
        "invalid_reason": reason,
        "rate_rps": spec.effective_rate,
        "burstiness": "poisson" if spec.gamma_shape is None else f"gamma:{spec.gamma_shape:g}",
        **res,
        "lag_p99_s": lag99,
        "lag_p99_max_s": spec.lag_p99_max_s,
        "stats": summ if valid else None,
        "records": str(out / "records.jsonl"),
    }
    (out / "report.json").write_text(json.dumps(report, indent=1))
    return report


def stream_report(records: Iterable[Mapping[str, Any]] | Path) -> dict[str, Any]:
    """``StreamStats.summary`` of a records file (streamed line by line) or iterable."""
    st = StreamStats(REPORT_FLUSH_RECORDS)
    it = iter_records(records) if isinstance(records, Path) else records
    for r in it:
        st.add(r)
    return st.summary()


def run_trace_soak(
    url: str,
    trace: str | os.PathLike[str],
    out: Path,
    speed: float = 1.0,
    lag_p99_max_s: float = 0.05,
    max_concurrency: int = 1024,
    model: str = "sim",
    timeout_s: float = 60.0,
    ceiling_rps: float | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``load soak --trace``: replay a trace open loop and write ``<out>/records.jsonl`` and
    ``<out>/report.json``, judged as ``soak.run_soak`` judges a soak (invalid when the schedule
    lag P99 exceeds ``lag_p99_max_s``: the client could not keep the trace's schedule).

    Args:
        url: target base URL. trace: the trace file. out: output directory (created).
        speed: trace time scale. lag_p99_max_s: validity bound, seconds.
        max_concurrency: in-flight cap (a request due while it is full is recorded
            ``not_sent``: the report's ``unsent``).
        model, timeout_s, headers: request shape and per-attempt timeout (TTFT and idle limits
            equal to it, as the soak's).
        ceiling_rps: client ceiling for the refusal rule (``ceiling.check_rate``, mean rate).

    Returns:
        ``run_soak``'s report keys (``valid, invalid_reason, rate_rps, sent, unsent, elapsed_s,
        lag_p99_s, lag_p99_max_s, stats, records``) plus ``trace`` (``trace_summary``).

    Raises:
        ValueError: unreadable or invalid trace, invalid speed.
        ceiling.CeilingRefused: the trace's mean rate needs more than half the client ceiling.
        OSError: the output directory is not writable.
    """
    spec = LoadSpec(
        url=url, model=model, timeout_s=timeout_s, ttft_timeout_s=timeout_s,
        idle_timeout_s=timeout_s, max_concurrency=max_concurrency, headers=dict(headers or {}),
        trace=str(trace), trace_speed=speed,
    )  # fmt: skip
    summary_t = trace_summary(spec.trace_requests, speed)
    check_rate(spec.rate_rps, ceiling_rps, 1, "soak")
    out.mkdir(parents=True, exist_ok=True)
    res = run_load_blocking(spec, out / "records.jsonl")
    stats = stream_report(out / "records.jsonl")
    lag99 = stats.get("p99_send_lag_s")
    valid = lag99 is not None and lag99 <= lag_p99_max_s
    reason = None
    if not valid:
        reason = (
            "no request sent"
            if lag99 is None
            else f"schedule lag P99 {lag99 * 1000:.1f} ms > {lag_p99_max_s * 1000:.1f} ms: "
            "the client could not keep the trace's schedule"
        )
    report = {
        "valid": valid,
        "invalid_reason": reason,
        "rate_rps": spec.rate_rps,
        "burstiness": "trace",
        "sent": res["sent"],
        "unsent": res["not_sent"],
        "elapsed_s": res["elapsed_s"],
        "lag_p99_s": lag99,
        "lag_p99_max_s": lag_p99_max_s,
        "stats": stats if valid else None,
        "records": str(out / "records.jsonl"),
        "trace": {"path": str(trace), **summary_t},
    }
    (out / "report.json").write_text(json.dumps(report, indent=1))
    return report
