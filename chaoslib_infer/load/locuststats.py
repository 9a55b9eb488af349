"""Locust-format CSV stats from our own records, so dashboards that read Locust's ``--csv`` output
read our drills and load runs too.

``write_locust_stats(records_path)`` writes, beside the records file (prefix = its stem, so
``records.jsonl`` gives ``records_stats.csv``; a Locust run's own ``locust_*.csv`` is never
overwritten):

* ``<prefix>_stats.csv``: Locust's columns (``Type, Name, Request Count, Failure Count, Median
  Response Time, Average Response Time, Min Response Time, Max Response Time, Average Content
  Size, Requests/s, Failures/s, 50%, 66%, 75%, 80%, 90%, 95%, 98%, 99%, 99.9%, 99.99%, 100%``),
  one row for the endpoint and the ``Aggregated`` row, then the LLM columns Locust lacks:
  ``TTFT 50%, TTFT 90%, TTFT 99%, ITL 50%, ITL 90%, ITL 99%, Output Tokens/s``;
* ``<prefix>_stats_history.csv``: one ``Aggregated`` row per second of the run (Locust's columns:
  ``Timestamp`` unix s, ``User Count``, ``Type``, ``Name``, ``Requests/s`` and ``Failures/s`` of
  that second, cumulative percentiles, ``Total ...`` columns), then the same LLM columns
  (cumulative);
* ``<prefix>_failures.csv``: ``Method, Name, Error, Occurrences, First Seen, Last Seen``, one row
  per error class (``Error`` = ``<error_class>: <first message seen>``).

Conventions (Locust's, in milliseconds): one request per **attempt** record (a retry is a
request, as Locust counts it), counted when it ends; response time = ``end_at - sent_at`` of every
attempt, failed ones included; percentiles are integers, ``N/A`` without requests; ``Average
Content Size`` is the generated text length in characters (``text_len``; records keep no byte
count). ``User Count`` is the number of attempts in flight at that second (an open-loop client
has no users). TTFT and ITL follow ``docs/definitions.md`` (TTFT from ``sent_at`` to the first
output chunk, ITL every gap between output chunks) over successful attempts. Records of class
``cut_off`` (in flight when the load stopped, outcome unknown) are left out, as the rates leave
them out. Memory: a few numbers per record plus HDR bucket counts per second of the run (records
are read once, streamed; chunk times are never kept).
"""

from __future__ import annotations

import csv
import math
import os
from array import array
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from .hdrbatch import bucket_counts
from .records import iter_records

__all__ = [
    "FAILURES_COLUMNS",
    "HISTORY_COLUMNS",
    "LLM_COLUMNS",
    "PERCENTILES",
    "STATS_COLUMNS",
    "write_locust_stats",
]

#: Locust's ``PERCENTILES_TO_REPORT``.
PERCENTILES: tuple[float, ...] = (
    0.50,
    0.66,
    0.75,
    0.80,
    0.90,
    0.95,
    0.98,
    0.99,
    0.999,
    0.9999,
    1.0,
)
_PCT_NAMES = [
    f"{int(p * 100) if (p * 100).is_integer() else round(100 * p, 6)}%" for p in PERCENTILES
]
#: Columns of ``*_stats.csv`` (Locust's, then ``LLM_COLUMNS``).
LLM_COLUMNS: tuple[str, ...] = (
    "TTFT 50%", "TTFT 90%", "TTFT 99%", "ITL 50%", "ITL 90%", "ITL 99%", "Output Tokens/s",
)  # fmt: skip
STATS_COLUMNS: tuple[str, ...] = (
    "Type", "Name", "Request Count", "Failure Count", "Median Response Time",
    "Average Response Time", "Min Response Time", "Max Response Time", "Average Content Size",
    "Requests/s", "Failures/s", *_PCT_NAMES, *LLM_COLUMNS,
)  # fmt: skip
HISTORY_COLUMNS: tuple[str, ...] = (
    "Timestamp", "User Count", "Type", "Name", "Requests/s", "Failures/s", *_PCT_NAMES,
    "Total Request Count", "Total Failure Count", "Total Median Response Time",
    "Total Average Response Time", "Total Min Response Time", "Total Max Response Time",
    "Total Average Content Size", *LLM_COLUMNS,
)  # fmt: skip
FAILURES_COLUMNS: tuple[str, ...] = (
    "Method", "Name", "Error", "Occurrences", "First Seen", "Last Seen",
)  # fmt: skip

_US = 1000.0  # histogram unit: microseconds, reported in ms
_MAX_US = 3600 * 1_000_000


def _utc(t: float) -> str:
    return datetime.fromtimestamp(int(t), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Second:
    """What the records that ended in one second add: counts and sums, and their TTFT, ITL and
    response-time values in microseconds, compacted into HDR bucket counts (``hdrbatch``) once
    ``_RAW_MAX`` raw values wait in all seconds together, so memory stays a few numbers per
    record."""

    __slots__ = (
        "n", "failed", "sum_ms", "min_ms", "max_ms", "chars", "tokens", "raw", "ct", "starts",
        "buckets",
    )  # fmt: skip

    def __init__(self) -> None:
        self.n = self.failed = self.chars = self.tokens = 0
        self.sum_ms = self.max_ms = 0.0
        self.min_ms: float | None = None
        #: raw microsecond values waiting per metric (``e2e``, ``ttft``); ITL comes from ``ct``
        self.raw: dict[str, list[float]] = {"e2e": [], "ttft": []}
        #: chunk times of the waiting records, concatenated, and where each record's start
        self.ct: list[float] = []
        self.starts: list[int] = []
        #: ``{metric: {bucket's lowest value: count}}``
        self.buckets: dict[str, dict[int, int]] = {"e2e": {}, "ttft": {}, "itl": {}}

    def add(self, r: dict[str, Any], ms: float) -> int:
        """Count one record (``ms``: its response time); returns the raw values it added."""
        self.n += 1
        ok = bool(r.get("ok"))
        self.failed += not ok
        self.sum_ms += ms
        self.min_ms = ms if self.min_ms is None or ms < self.min_ms else self.min_ms
        self.max_ms = ms if ms > self.max_ms else self.max_ms
        self.chars += int(r.get("text_len") or 0)
        raw = self.raw
        raw["e2e"].append(ms * _US)
        added = 1
        if ok:
            self.tokens += int(r.get("output_tokens") or 0)
            ft = r.get("first_token_at")
            if ft is not None:
                raw["ttft"].append((ft - r["sent_at"]) * 1e6)
                added += 1
            ct = r.get("chunk_times") or []
            if len(ct) > 1:
                self.starts.append(len(self.ct))
                self.ct.extend(ct)
                added += len(ct)
        return added

    def compact(self, h: HdrHistogram) -> None:
        """Move the raw values into bucket counts (``h``: the bucket layout)."""
        waiting = {name: np.asarray(vals, dtype=np.float64) for name, vals in self.raw.items()}
        if self.ct:
            gaps = np.diff(np.asarray(self.ct, dtype=np.float64))
            keep = np.ones(gaps.size, dtype=bool)
            keep[np.asarray(self.starts[1:], dtype=np.int64) - 1] = False  # across two records
            waiting["itl"] = gaps[keep] * 1e6
            self.ct.clear()
            self.starts.clear()
        for name, arr in waiting.items():
            if not arr.size:
                continue
            us = np.clip(np.trunc(arr), 1, _MAX_US).astype(np.int64)
            into = self.buckets[name]
            for v, c in zip(*bucket_counts(h, us), strict=True):
                into[v] = into.get(v, 0) + c
        for raw in self.raw.values():
            raw.clear()


_RAW_MAX = 1 << 18  # raw values all seconds may hold (~8 MB) before they are compacted


class _Agg:
    """Running Locust-style aggregates (ms) plus TTFT/ITL histograms, fed a second at a time."""

    def __init__(self) -> None:
        self.h = {k: HdrHistogram(1, _MAX_US, 3) for k in ("e2e", "ttft", "itl")}
        self.n = self.failed = 0
        self.sum_ms = 0.0
        self.min_ms: float | None = None
        self.max_ms = 0.0
        self.chars = 0
        self.tokens = 0

    def add(self, sec: _Second) -> None:
        """Add one second's records (compacted first)."""
        sec.compact(self.h["e2e"])
        _add_counts(self, sec)
        for name, counts in sec.buckets.items():
            h = self.h[name]
            for v, c in counts.items():
                h.record_value(v, c)

    def _pcts(self, name: str, ps: tuple[float, ...]) -> list[int | str]:
        h = self.h[name]
        if h.get_total_count() == 0:
            return ["N/A"] * len(ps)
        got = h.get_percentile_to_value_dict([p * 100 for p in ps])
        return [round(got[p * 100] / _US) for p in ps]

    def percentiles(self) -> list[int | str]:
        return self._pcts("e2e", PERCENTILES)

    def llm(self, elapsed_s: float) -> list[Any]:
        return [
            *self._pcts("ttft", (0.5, 0.9, 0.99)),
            *self._pcts("itl", (0.5, 0.9, 0.99)),
            round(self.tokens / elapsed_s, 3) if elapsed_s > 0 else 0.0,
        ]

    def totals(self) -> list[Any]:
        med = self._pcts("e2e", (0.5,))[0]
        return [
            self.n,
            self.failed,
            0 if med == "N/A" else med,
            self.sum_ms / self.n if self.n else 0.0,
            self.min_ms or 0,
            self.max_ms,
            self.chars / self.n if self.n else 0.0,
        ]


def write_locust_stats(
    records_path: str | os.PathLike[str],
    prefix: str | os.PathLike[str] | None = None,
    name: str = "/v1/chat/completions",
    method: str = "POST",
) -> dict[str, Path]:
    """Write ``*_stats.csv``, ``*_stats_history.csv`` and ``*_failures.csv`` from a records file
    (module docstring for columns and conventions).

    One pass over the records, streamed: each record is counted into the second it ended in
    (HDR bucket counts, ``hdrbatch``), so memory is a few numbers per record whatever its chunk
    count, and a 30-minute soak's 900,000 records take seconds, not minutes.

    Args:
        records_path: the attempt records (``records.jsonl``, ``docs/contracts.md`` section 3).
        prefix: output path prefix (default: the records file without its suffix, e.g.
            ``run/records`` -> ``run/records_stats.csv``).
        name, method: the Locust ``Name`` and ``Type`` of the endpoint row.

    Returns:
        ``{"stats": path, "history": path, "failures": path}``. An empty records file gives the
        headers, an ``Aggregated`` row of zeros and ``N/A`` percentiles, and no history row.

    Raises:
        OSError: the records cannot be read or the CSV files cannot be written.
        ValueError: a records line other than the last is not a JSON object.
    """
    src = Path(records_path)
    base = Path(prefix) if prefix is not None else src.with_suffix("")
    layout = HdrHistogram(1, _MAX_US, 3)
    seconds: dict[int, _Second] = {}
    sents, ends = array("d"), array("d")
    # per error class: [message of the first to end, count, first end, last end, its index]
    failures: dict[str, list[Any]] = {}
    waiting, dirty = 0, set()  # raw values waiting, in the seconds that hold them
    for i, r in enumerate(iter_records(src)):
        if r.get("error_class") == "cut_off" or r.get("cut_off"):
            continue
        sent, end = r.get("sent_at"), r.get("end_at")
        if not isinstance(sent, int | float) or not isinstance(end, int | float):
            continue
        sents.append(sent)
        ends.append(end)
        sec_no = math.floor(end)
        sec = seconds.get(sec_no)
        if sec is None:
            sec = seconds[sec_no] = _Second()
        waiting += sec.add(r, max((end - sent) * 1000.0, 0.0))
        dirty.add(sec_no)
        if waiting >= _RAW_MAX:
            for s in dirty:
                seconds[s].compact(layout)
            waiting, dirty = 0, set()
        if not r.get("ok"):
            cls = r.get("error_class") or "error"
            f = failures.get(cls)
            if f is None:
                failures[cls] = [f"{cls}: {r.get('error') or ''}".rstrip(": "), 1, end, end, i]
            else:
                f[1] += 1
                if end < f[2]:  # a tie keeps the earlier line (a stable sort by end time)
                    f[0], f[2], f[4] = f"{cls}: {r.get('error') or ''}".rstrip(": "), end, i
                f[3] = max(f[3], end)
    any_rows = bool(sents)
    start = min(sents) if any_rows else 0.0
    end_all = max(ends) if any_rows else 0.0
    elapsed = max(end_all - start, 1e-9) if any_rows else 0.0
    first = int(start)
    early = [s for s in seconds if s < first]  # ended before the first send: the first second
    for s in early:
        into = seconds.setdefault(first, _Second())
        _merge(into, seconds.pop(s), layout)

    hist = _Agg()
    history: list[list[Any]] = []
    if any_rows:
        sent_sorted = np.sort(np.frombuffer(sents, dtype=np.float64))
        end_sorted = np.sort(np.frombuffer(ends, dtype=np.float64))
        for sec_no in range(first, int(end_all) + 1):
            n0, f0 = hist.n, hist.failed
            got = seconds.pop(sec_no, None)
            if got is not None:
                hist.add(got)
            t_end = sec_no + 1.0
            in_flight = int(np.searchsorted(sent_sorted, t_end, "left")) - int(
                np.searchsorted(end_sorted, t_end, "left")
            )
            history.append(
                [
                    sec_no,
                    max(in_flight, 0),
                    "",
                    "Aggregated",
                    f"{hist.n - n0:f}",
                    f"{hist.failed - f0:f}",
                    *hist.percentiles(),
                    *hist.totals(),
                    *hist.llm(max(min(t_end, end_all) - start, 1e-9)),
                ]  # fmt: skip
            )
    total = hist  # every second added: the whole run

    def stats_row(typ: str, nm: str) -> list[Any]:
        t = total.totals()
        rps = total.n / elapsed if elapsed else 0.0
        fps = total.failed / elapsed if elapsed else 0.0
        return [typ, nm, t[0], t[1], t[2], t[3], t[4], t[5], t[6], rps, fps,
                *total.percentiles(), *total.llm(elapsed)]  # fmt: skip

    out = {
        "stats": Path(f"{base}_stats.csv"),
        "history": Path(f"{base}_stats_history.csv"),
        "failures": Path(f"{base}_failures.csv"),
    }
    with out["stats"].open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(STATS_COLUMNS)
        if any_rows:
            w.writerow(stats_row(method, name))
        w.writerow(stats_row("", "Aggregated"))
    with out["failures"].open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(FAILURES_COLUMNS)
        # most frequent first; a tie in the order the classes first ended (then file order)
        for msg, count, first_end, last_end, _ in sorted(
            failures.values(), key=lambda f: (-f[1], f[2], f[4])
        ):
            w.writerow([method, name, msg, count, _utc(first_end), _utc(last_end)])
    with out["history"].open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(HISTORY_COLUMNS)
        w.writerows(history)
    return out


def _add_counts(into: _Agg | _Second, other: _Second) -> None:
    """Add ``other``'s counts and sums (not its values) to ``into``."""
    into.n += other.n
    into.failed += other.failed
    into.sum_ms += other.sum_ms
    if other.min_ms is not None:
        into.min_ms = other.min_ms if into.min_ms is None else min(into.min_ms, other.min_ms)
    into.max_ms = max(into.max_ms, other.max_ms)
    into.chars += other.chars
    into.tokens += other.tokens


def _merge(into: _Second, other: _Second, layout: HdrHistogram) -> None:
    """Add ``other``'s records to ``into`` (both compacted)."""
    into.compact(layout)
    other.compact(layout)
    _add_counts(into, other)
    for name, counts in other.buckets.items():
        mine = into.buckets[name]
        for v, c in counts.items():
            mine[v] = mine.get(v, 0) + c
