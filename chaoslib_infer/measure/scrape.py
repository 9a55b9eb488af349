"""Server-side Prometheus ``/metrics`` scraper (vLLM, SGLang and TGI metric names).

A ``MetricsScraper`` polls one or more ``/metrics`` URLs on a fixed period (default 0.5 s, so at
least once per second) beside a load run and writes one JSON line per URL and poll:
``{"t": unix s, "url", "ok", "error", "values": {canonical name: float}}``. Names are mapped to
canonical ones so that queueing (``waiting``, ``queue_time``) can be told from engine time
(``ttft``, ``itl``, ``e2e``) whatever the engine:

===================  ===========================================  ==========================  ===================================
canonical            vLLM                                         SGLang                      TGI
===================  ===========================================  ==========================  ===================================
running              vllm:num_requests_running                    sglang:num_running_reqs     tgi_batch_current_size
waiting              vllm:num_requests_waiting                    sglang:num_queue_reqs       tgi_queue_size
kv_usage             vllm:kv_cache_usage_perc (gpu_cache_...)     sglang:token_usage          -
ttft (hist)          vllm:time_to_first_token_seconds             sglang:time_to_first_token  -
itl (hist)           vllm:inter_token_latency_seconds             sglang:inter_token_latency  tgi_request_mean_time_per_token
e2e (hist)           vllm:e2e_request_latency_seconds             sglang:e2e_request_latency  tgi_request_duration
queue_time (hist)    vllm:request_queue_time_seconds              sglang:queue_time_seconds   tgi_request_queue_duration
generation_tokens    vllm:generation_tokens_total                 sglang:generation_tokens    tgi_request_generated_tokens (sum)
requests_done        vllm:request_success_total                   sglang:num_requests_total   tgi_request_success
===================  ===========================================  ==========================  ===================================

Histograms are stored as ``<name>_sum`` and ``<name>_count`` (summed over label sets);
``window_summary`` turns two samples into window means (delta sum / delta count, seconds).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from chaoslib_infer.safety.redact import clip

__all__ = ["CANONICAL", "MetricsScraper", "parse_metrics", "read_samples", "window_summary"]

#: canonical name -> (kind, family names in Prometheus exposition, without _total/_sum suffixes).
CANONICAL: dict[str, tuple[str, tuple[str, ...]]] = {
    "running": ("gauge", ("vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size")),
    "waiting": ("gauge", ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size")),
    "kv_usage": ("gauge", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")),
    "ttft": ("hist", ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds")),
    "itl": ("hist", ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
                     "sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds",
                     "tgi_request_mean_time_per_token_duration")),
    "e2e": ("hist", ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds",
                     "tgi_request_duration")),
    "queue_time": ("hist", ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds",
                            "tgi_request_queue_duration")),
    "generation_tokens": ("counter", ("vllm:generation_tokens", "sglang:generation_tokens",
                                      "tgi_request_generated_tokens")),
    "requests_done": ("counter", ("vllm:request_success", "sglang:num_requests",
                                  "tgi_request_success")),
}  # fmt: skip

_LOOKUP: dict[str, tuple[str, str]] = {
    fam: (canon, kind) for canon, (kind, fams) in CANONICAL.items() for fam in fams
}


def _family_name(name: str) -> str:
    for suffix in ("_total",):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def parse_metrics(text: str) -> dict[str, float]:
    """Map a Prometheus text exposition to canonical values (see module table).

    Gauges and counters are summed over label sets; histograms and summaries give ``<c>_sum`` and
    ``<c>_count``; a TGI histogram mapped to a counter (``tgi_request_generated_tokens``) gives its
    sum. The first family found for a canonical name wins (vLLM's ``kv_cache_usage_perc`` before
    the older ``gpu_cache_usage_perc``).

    Raises:
        ValueError: the text is not a valid exposition.
    """
    out: dict[str, float] = {}
    seen: dict[str, str] = {}
    for fam in text_string_to_metric_families(text):
        hit = _LOOKUP.get(fam.name) or _LOOKUP.get(_family_name(fam.name))
        if hit is None:
            continue
        canon, kind = hit
        if seen.setdefault(canon, fam.name) != fam.name:
            continue
        for s in fam.samples:
            if not math.isfinite(s.value):
                continue
            if kind == "hist":
                if s.name.endswith("_sum"):
                    out[canon + "_sum"] = out.get(canon + "_sum", 0.0) + s.value
                elif s.name.endswith("_count"):
                    out[canon + "_count"] = out.get(canon + "_count", 0.0) + s.value
            elif fam.type in ("histogram", "summary"):
                if s.name.endswith("_sum"):
                    out[canon] = out.get(canon, 0.0) + s.value
            elif not s.name.endswith("_created"):
                out[canon] = out.get(canon, 0.0) + s.value
    return out


class MetricsScraper:
    """Poll ``/metrics`` URLs every ``interval_s`` and append samples to a JSONL file.

    Use ``async with MetricsScraper(...)`` around the load (the loop is a task of the running
    event loop; it stops on exit). Every poll writes one line per URL, also on failure
    (``ok: false`` with the error), so gaps in coverage are visible.

    Args:
        urls: full ``/metrics`` URLs (loopback in the lab).
        out_path: samples file (JSONL), truncated.
        interval_s: polling period in seconds (<= 1 for the "at least once per second" rule).
        timeout_s: per-request timeout in seconds.

    Raises:
        ValueError: ``interval_s`` not in (0, 60].
        ConfigError: a URL outside the allowlist (loopback by default,
            :mod:`chaoslib_infer.safety.allowlist`) or with a control character. Redirects are
            never followed (a 3xx is a failed sample).
    """

    def __init__(
        self,
        urls: Sequence[str],
        out_path: str | Path,
        interval_s: float = 0.5,
        timeout_s: float = 2.0,
    ) -> None:
        if not (0 < interval_s <= 60):
            raise ValueError(f"interval_s must be in (0, 60], got {interval_s!r}")
        from chaoslib_infer.safety.allowlist import check_target

        for url in urls:  # the blast radius covers every outbound client (issue 13)
            check_target(url, what="metrics URL")
        self.urls = list(urls)
        self.out_path = Path(out_path)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.samples = 0
        self.failures = 0
        self._task: asyncio.Task[None] | None = None
        self._fh: IO[str] | None = None

    async def __aenter__(self) -> MetricsScraper:
        self._fh = open(self.out_path, "w", encoding="utf-8")  # noqa: SIM115 - closed in exit
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    async def _poll(self, session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
        t = time.time()
        try:
            async with session.get(url, allow_redirects=False) as resp:  # never followed
                text = await resp.text()
                if resp.status != 200:
                    return {"t": t, "url": url, "ok": False, "error": f"HTTP {resp.status}"}
            return {"t": t, "url": url, "ok": True, "values": parse_metrics(text)}
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            return {
                "t": t,
                "url": url,
                "ok": False,
                "error": clip(f"{type(exc).__name__}: {exc}", 200),
            }

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session:
            next_t = time.perf_counter()
            while True:
                rows = await asyncio.gather(*(self._poll(session, u) for u in self.urls))
                assert self._fh is not None
                for row in rows:
                    self._fh.write(json.dumps(row, separators=(",", ":")) + "\n")
                    self.samples += 1
                    self.failures += 0 if row["ok"] else 1
                self._fh.flush()
                next_t += self.interval_s
                delay = next_t - time.perf_counter()
                if delay < 0:  # fell behind (slow server): restart the grid from now
                    next_t, delay = time.perf_counter(), 0.0
                await asyncio.sleep(delay)


def read_samples(path: str | Path) -> list[dict[str, Any]]:
    """Read a samples file written by ``MetricsScraper`` (a truncated last line is skipped)."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def window_summary(
    samples: Iterable[Mapping[str, Any]], start: float | None = None, end: float | None = None
) -> dict[str, Any]:
    """Server-side figures of a window from scraped samples (summed over URLs).

    Args:
        samples: rows written by ``MetricsScraper``.
        start: window start, unix s (None = first sample).
        end: window end, unix s (None = last sample).

    Returns:
        ``samples, failed, max_gap_s`` (largest interval between successful polls of one URL),
        ``mean_<h>_s`` for each histogram ``h`` (delta sum / delta count between the first and
        last successful sample of each URL in the window; None without completions),
        ``max_waiting, max_running`` (gauges), ``generation_tokens, requests_done`` (counter
        deltas).
    """
    by_url: dict[str, list[Mapping[str, Any]]] = {}
    failed = n = 0
    for s in samples:
        t = s.get("t")
        if not isinstance(t, int | float):
            continue
        if (start is not None and t < start) or (end is not None and t > end):
            continue
        n += 1
        if not s.get("ok"):
            failed += 1
            continue
        by_url.setdefault(str(s.get("url")), []).append(s)
    out: dict[str, Any] = {"samples": n, "failed": failed, "max_gap_s": None}
    sums: dict[str, float] = {}
    gaps: list[float] = []
    gauges: dict[str, float] = {}
    for rows in by_url.values():
        rows.sort(key=lambda r: r["t"])
        gaps.extend(b["t"] - a["t"] for a, b in zip(rows, rows[1:], strict=False))
        first, last = rows[0]["values"], rows[-1]["values"]
        for k, v in last.items():
            if k.endswith(("_sum", "_count")) or k in ("generation_tokens", "requests_done"):
                sums[k] = sums.get(k, 0.0) + v - first.get(k, 0.0)
        for r in rows:
            for g in ("waiting", "running"):
                if g in r["values"]:
                    gauges[g] = max(gauges.get(g, 0.0), r["values"][g])
    out["max_gap_s"] = max(gaps) if gaps else None
    for h in ("ttft", "itl", "e2e", "queue_time"):
        c = sums.get(h + "_count", 0.0)
        out[f"mean_{h}_s"] = sums.get(h + "_sum", 0.0) / c if c > 0 else None
    out["max_waiting"] = gauges.get("waiting")
    out["max_running"] = gauges.get("running")
    out["generation_tokens"] = sums.get("generation_tokens")
    out["requests_done"] = sums.get("requests_done")
    return out
