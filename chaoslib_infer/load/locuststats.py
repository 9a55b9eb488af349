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
them out. Memory: a few numbers per record plus fixed-size histograms.
"""

from __future__ import annotations

import bisect
import csv
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hdrh.histogram import HdrHistogram

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


class _Agg:
    """Running Locust-style aggregates (ms) plus TTFT/ITL histograms."""

    def __init__(self) -> None:
        self.e2e = HdrHistogram(1, _MAX_US, 3)
        self.ttft = HdrHistogram(1, _MAX_US, 3)
        self.itl = HdrHistogram(1, _MAX_US, 3)
        self.n = self.failed = 0
        self.sum_ms = 0.0
        self.min_ms: float | None = None
        self.max_ms = 0.0
        self.chars = 0
        self.tokens = 0

    def add(self, r: dict[str, Any]) -> None:
        ms = max((r["end_at"] - r["sent_at"]) * 1000.0, 0.0)
        self.n += 1
        self.failed += not r["ok"]
        self.sum_ms += ms
        self.min_ms = ms if self.min_ms is None else min(self.min_ms, ms)
        self.max_ms = max(self.max_ms, ms)
        self.chars += int(r.get("text_len") or 0)
        self.e2e.record_value(max(1, min(int(ms * _US), _MAX_US)))
        if r["ok"]:
            self.tokens += int(r.get("output_tokens") or 0)
            if r.get("first_token_at") is not None:
                t = (r["first_token_at"] - r["sent_at"]) * 1e6
                self.ttft.record_value(max(1, min(int(t), _MAX_US)))
            ct = r.get("chunk_times") or []
            for a, b in zip(ct, ct[1:], strict=False):
                self.itl.record_value(max(1, min(int((b - a) * 1e6), _MAX_US)))

    @staticmethod
    def _pct(h: HdrHistogram, p: float) -> int | str:
        if h.get_total_count() == 0:
            return "N/A"
        return round(h.get_value_at_percentile(p * 100) / _US)

    def percentiles(self) -> list[int | str]:
        return [self._pct(self.e2e, p) for p in PERCENTILES]

    def llm(self, elapsed_s: float) -> list[Any]:
        return [
            *(self._pct(self.ttft, p) for p in (0.5, 0.9, 0.99)),
            *(self._pct(self.itl, p) for p in (0.5, 0.9, 0.99)),
            round(self.tokens / elapsed_s, 3) if elapsed_s > 0 else 0.0,
        ]

    def totals(self) -> list[Any]:
        med = self._pct(self.e2e, 0.5)
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
    rows: list[dict[str, Any]] = []
    for r in iter_records(src):
        if r.get("error_class") == "cut_off" or r.get("cut_off"):
            continue
        if not isinstance(r.get("sent_at"), int | float) or not isinstance(
            r.get("end_at"), int | float
        ):
            continue
        rows.append(
            {
                "sent_at": r["sent_at"], "end_at": r["end_at"], "ok": bool(r.get("ok")),
                "first_token_at": r.get("first_token_at"),
                "chunk_times": r.get("chunk_times") if r.get("ok") else None,
                "text_len": r.get("text_len"), "output_tokens": r.get("output_tokens"),
                "error_class": r.get("error_class"), "error": r.get("error"),
            }
        )  # fmt: skip
    rows.sort(key=lambda r: r["end_at"])
    start = min((r["sent_at"] for r in rows), default=0.0)
    end = rows[-1]["end_at"] if rows else 0.0
    elapsed = max(end - start, 1e-9) if rows else 0.0

    total = _Agg()
    failures: dict[str, list[Any]] = {}
    for r in rows:
        total.add(r)
        if not r["ok"]:
            cls = r["error_class"] or "error"
            f = failures.get(cls)
            if f is None:
                failures[cls] = [f"{cls}: {r['error'] or ''}".rstrip(": "), 1, r["end_at"], 0.0]
            else:
                f[1] += 1
            failures[cls][3] = r["end_at"]

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
        if rows:
            w.writerow(stats_row(method, name))
        w.writerow(stats_row("", "Aggregated"))
    with out["failures"].open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(FAILURES_COLUMNS)
        for msg, count, first, last in sorted(failures.values(), key=lambda f: -f[1]):
            w.writerow([method, name, msg, count, _utc(first), _utc(last)])
    sents = sorted(r["sent_at"] for r in rows)
    ends = [r["end_at"] for r in rows]
    with out["history"].open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(HISTORY_COLUMNS)
        hist = _Agg()
        i = 0
        if rows:
            for sec in range(int(start), int(end) + 1):
                n0, f0 = hist.n, hist.failed
                while i < len(rows) and rows[i]["end_at"] < sec + 1:
                    hist.add(rows[i])
                    i += 1
                t_end = sec + 1.0
                in_flight = bisect.bisect_left(sents, t_end) - bisect.bisect_left(ends, t_end)
                w.writerow(
                    [
                        sec,
                        max(in_flight, 0),
                        "",
                        "Aggregated",
                        f"{hist.n - n0:f}",
                        f"{hist.failed - f0:f}",
                        *hist.percentiles(),
                        *hist.totals(),
                        *hist.llm(max(min(t_end, end) - start, 1e-9)),
                    ]  # fmt: skip
                )
    return out
