"""Recompute TTFT / ITL / TPOT / E2E under our, vLLM's, AIPerf's and GuideLLM's definitions.

Our definitions are those of ``docs/definitions.md`` ("Metrics"); the other tools'
are restated here from their own code and documentation so that our numbers can be compared with
theirs on the same raw chunk times:

* **ours**: TTFT = first output-bearing chunk (content, reasoning or tool-call delta; the role-only
  first chunk of a chat stream is skipped) minus send time; ITL = every raw gap between successive
  output-bearing chunks; TPOT = (last output chunk - first output chunk) / (output tokens - 1);
  E2E = end of the response (``[DONE]``, else the last byte) minus send time. Output tokens =
  ``usage.completion_tokens`` when sent, else the number of output chunks (source recorded).
* **vllm** (``vllm bench serve``, ``backend_request_func`` OpenAI chat/completions): TTFT = first
  data event that has a non-empty ``choices`` list, **including the role-only chunk** (so it reads
  low under chunked prefill); ITL = gaps between successive ``choices`` events after that one
  (the finish-only chunk counts); latency = the last data event other than ``[DONE]`` (a
  usage-only chunk counts) minus send; TPOT = (latency - TTFT) / (output tokens - 1). Aggregates:
  TTFT and TPOT per request, ITL pooled over all gaps of all requests.
* **aiperf** (AIPerf metrics reference): responses are the chunks that carry generated output;
  TTFT = first response - start; request latency = last response - start; ITL = (request latency
  - TTFT) / (output sequence length - 1) per request; ICL (inter-chunk latency) = the raw gaps
  between responses. Output sequence length = server usage when sent, else our token count
  (AIPerf itself tokenizes the text by default; we have no tokenizer here, which the
  ``tokens_source`` field records).
* **guidellm** (``GenerativeRequestStats``): TTFT = first token time - request start; ITL =
  (last token time - first token time) / (output tokens - 1); TPOT = (last token time - request
  start) / output tokens (it **includes** TTFT); latency = request end - request start.

Two inputs are supported: a raw timed byte stream (``timeline_from_blocks``: every event's arrival
time is known, so every definition is exact), and a load record (contracts.md section 3; only
output-chunk times are recorded, so vLLM's TTFT uses ``first_byte_at``, the arrival of the role
chunk that vLLM-style servers send first, and vLLM's finish/usage chunk times fall back to
``end_at``; ``definitions_from_record`` marks these ``approximate``).

Times are seconds (any consistent clock); ``None`` means undefined (e.g. ITL of a 1-token reply).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram

from chaoslib_infer.measure.sse import SSEDecoder, StreamParser

__all__ = [
    "TOOLS",
    "Timeline",
    "definitions_from_record",
    "definitions_from_timeline",
    "export_definitions",
    "timeline_from_blocks",
]

#: Tools whose definitions are recomputed, in report order.
TOOLS: tuple[str, ...] = ("ours", "vllm", "aiperf", "guidellm")
_US = 1_000_000
_PCTS = (50.0, 90.0, 99.0)


@dataclass
class Timeline:
    """Every data event of one streamed reply with its arrival time (seconds).

    Attributes:
        sent_at: request send time.
        end_at: end of the body (time of the last block, or of ``[DONE]``).
        first_byte_at: arrival of the first body block, or None.
        choice_times: events with a non-empty ``choices`` list (role, output, finish chunks).
        output_times: output-bearing chunk times (``StreamParser`` definition).
        data_times: every data event other than ``[DONE]`` (incl. usage-only chunks).
        done_at: time of ``[DONE]``, or None.
        usage_tokens: ``usage.completion_tokens`` or None.
        error_class: ``StreamParser.classify`` class or None; message in ``error``.
        usage_mismatch: the server's usage count is below the number of output chunks (each
            chunk carries at least one token, so the count cannot be right).
    """

    sent_at: float
    end_at: float
    first_byte_at: float | None = None
    choice_times: list[float] = field(default_factory=list)
    output_times: list[float] = field(default_factory=list)
    data_times: list[float] = field(default_factory=list)
    done_at: float | None = None
    usage_tokens: int | None = None
    error_class: str | None = None
    error: str | None = None
    usage_mismatch: bool = False


def _has_choices(data: str) -> bool:
    try:
        obj = json.loads(data)
    except Exception:
        return False
    return isinstance(obj, dict) and isinstance(obj.get("choices"), list) and bool(obj["choices"])


def timeline_from_blocks(sent_at: float, blocks: Sequence[tuple[float, bytes]]) -> Timeline:
    """Parse a raw streamed body delivered as timed blocks.

    Each SSE event is timed at the arrival of the block that completed it (that is when a client
    can see it), so merged frames share a time and a frame split across blocks gets the later one.

    Args:
        sent_at: send time of the request (seconds).
        blocks: ``(arrival time, bytes)`` in arrival order; any split of the body.

    Returns:
        The ``Timeline`` (classification by ``sse.StreamParser``; never raises on input bytes).
    """
    parser = StreamParser()
    dec = SSEDecoder()  # a second decoder, to time each event (the parser's is internal)
    tl = Timeline(sent_at=sent_at, end_at=blocks[-1][0] if blocks else sent_at)
    if blocks:
        tl.first_byte_at = blocks[0][0]

    def take(t: float, events: Iterable[Any], n_out: int) -> None:
        for ev in events:
            data = ev.data.strip()
            if ev.event == "error" or not data:
                continue
            if data == "[DONE]":
                if tl.done_at is None:
                    tl.done_at = t
                continue
            if tl.done_at is not None:
                continue  # the parser ignores everything after [DONE]
            tl.data_times.append(t)
            if _has_choices(data):
                tl.choice_times.append(t)
        tl.output_times.extend([t] * n_out)

    for t, data in blocks:
        take(t, dec.feed(data), parser.feed(data))
    take(tl.end_at, dec.close(), parser.close())
    tl.error_class, tl.error = parser.classify()
    tl.usage_tokens = parser.usage_tokens
    if tl.done_at is not None:
        tl.end_at = tl.done_at
    tl.usage_mismatch = tl.usage_tokens is not None and tl.usage_tokens < parser.output_chunks
    return tl


def _div(a: float | None, b: float) -> float | None:
    if a is None or b <= 0:
        return None
    return a / b


def _compute(
    sent: float,
    end: float,
    output_times: Sequence[float],
    choice_times: Sequence[float],
    data_times: Sequence[float],
    usage_tokens: int | None,
) -> dict[str, dict[str, Any]]:
    n_chunks = len(output_times)
    if usage_tokens is not None:
        tokens, source = usage_tokens, "usage"
    else:
        tokens, source = n_chunks, "chunks"
    first = output_times[0] if output_times else None
    last = output_times[-1] if output_times else None
    gaps = [b - a for a, b in zip(output_times, output_times[1:], strict=False)]
    span = None if first is None or last is None else last - first
    ttft = None if first is None else first - sent
    ours = {
        "ttft": ttft,
        "itl": gaps,
        "tpot": _div(span, tokens - 1),
        "e2e": end - sent,
        "output_tokens": tokens,
        "tokens_source": source,
    }
    v_first = choice_times[0] if choice_times else None
    v_ttft = None if v_first is None else v_first - sent
    v_last = data_times[-1] if data_times else None
    v_lat = None if v_last is None else v_last - sent
    vllm = {
        "ttft": v_ttft,
        "itl": [b - a for a, b in zip(choice_times, choice_times[1:], strict=False)],
        "tpot": None if v_lat is None or v_ttft is None else _div(v_lat - v_ttft, tokens - 1),
        "e2e": v_lat,
        "output_tokens": tokens,
    }
    a_ttft = ttft
    a_lat = None if last is None else last - sent
    aiperf = {
        "ttft": a_ttft,
        "itl": None if a_lat is None or a_ttft is None else _div(a_lat - a_ttft, tokens - 1),
        "icl": gaps,
        "e2e": a_lat,
        "output_tokens": tokens,
    }
    guidellm = {
        "ttft": a_ttft,
        "itl": _div(span, tokens - 1),
        "tpot": None if last is None else _div(last - sent, tokens),
        "e2e": end - sent,
        "output_tokens": tokens,
    }
    return {"ours": ours, "vllm": vllm, "aiperf": aiperf, "guidellm": guidellm}


def definitions_from_timeline(tl: Timeline) -> dict[str, Any]:
    """Every tool's per-request metrics for one raw stream (exact; see module docstring).

    Returns:
        ``{"ours": {...}, "vllm": {...}, "aiperf": {...}, "guidellm": {...}, "error_class",
        "error", "usage_mismatch", "approximate": False}``; seconds.
    """
    out: dict[str, Any] = _compute(
        tl.sent_at, tl.end_at, tl.output_times, tl.choice_times, tl.data_times, tl.usage_tokens
    )
    out.update(
        error_class=tl.error_class,
        error=tl.error,
        usage_mismatch=tl.usage_mismatch,
        approximate=False,
    )
    return out


def definitions_from_record(rec: Mapping[str, Any]) -> dict[str, Any]:
    """Every tool's per-request metrics for one load record (contracts.md section 3).

    vLLM's role-chunk time is taken as ``first_byte_at`` (else the first output chunk) and its
    last data event as ``end_at``; the result is marked ``approximate: True``.

    Returns:
        As ``definitions_from_timeline``.
    """
    sent = float(rec["sent_at"])
    end = float(rec.get("end_at") or sent)
    chunks = [float(t) for t in rec.get("chunk_times") or []]
    fb = rec.get("first_byte_at")
    role = [float(fb)] if isinstance(fb, int | float) and (not chunks or fb < chunks[0]) else []
    choice = role + chunks
    data = choice + ([end] if choice and end > choice[-1] else [])
    usage = rec.get("output_tokens") if rec.get("tokens_source") == "usage" else None
    out: dict[str, Any] = _compute(sent, end, chunks, choice, data, usage)
    out.update(
        error_class=rec.get("error_class"),
        error=rec.get("error"),
        usage_mismatch=usage is not None and usage < len(chunks),
        approximate=True,
    )
    return out


class _Dist:
    __slots__ = ("h", "n", "total")

    def __init__(self) -> None:
        self.h = HdrHistogram(1, 3600 * _US, 3)
        self.n = 0
        self.total = 0.0

    def add(self, v: float | None) -> None:
        if v is None or not math.isfinite(v):
            return
        self.h.record_value(min(max(int(round(v * _US)), 1), 3600 * _US))
        self.n += 1
        self.total += v

    def summary(self) -> dict[str, float | int | None]:
        out: dict[str, float | int | None] = {"n": self.n}
        out["mean"] = self.total / self.n if self.n else None
        for p in _PCTS:
            out[f"p{p:g}"] = self.h.get_value_at_percentile(p) / _US if self.n else None
        return out


def export_definitions(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Aggregate every tool's definitions over successful records, streaming (HDR histograms).

    Aggregation follows each tool: per-request values for TTFT/TPOT/E2E, and ITL pooled over every
    gap for ours and vLLM (raw gaps), per request for AIPerf and GuideLLM (averages). Failed
    records are excluded from the distributions and counted in ``censored_fraction``.

    Args:
        records: attempt records (any iterable; consumed once).

    Returns:
        ``{"requests", "ok", "censored_fraction", "output_tokens", "tools": {tool: {metric: {"n", "mean", "p50",
        "p90", "p99"}}}}``; seconds.
    """
    dists: dict[str, dict[str, _Dist]] = {t: {} for t in TOOLS}
    n = ok = tokens = 0
    for rec in records:
        n += 1
        if not rec.get("ok"):
            continue
        ok += 1
        d = definitions_from_record(rec)
        tokens += int(d["ours"]["output_tokens"])
        for tool in TOOLS:
            for metric, val in d[tool].items():
                if metric in ("tokens_source", "output_tokens"):
                    continue
                dist = dists[tool].setdefault(metric, _Dist())
                if isinstance(val, list):
                    for v in val:
                        dist.add(v)
                elif isinstance(val, int | float):
                    dist.add(float(val))
    return {
        "requests": n,
        "ok": ok,
        "censored_fraction": (n - ok) / n if n else None,
        "output_tokens": tokens,
        "tools": {t: {m: d.summary() for m, d in dists[t].items()} for t in TOOLS},
    }
