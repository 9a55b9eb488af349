"""What a load worker reports and how the runner merges it: the one result line
(``CHAOS_INFER_WORKER_RESULT {json}``, :data:`MARKER`, :func:`parse_result`), the HDR histograms
in it (:func:`encode_stats`, :func:`decode_stats`, :func:`merge_stats`: exact, bucket by bucket)
and the merged report (:func:`merge_results`).

Split out of :mod:`chaoslib_infer.load.workers` (its docstring describes the workers and the
runners), which re-exports every name here (import paths kept).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .soak import StreamStats

__all__ = [
    "MARKER",
    "decode_stats",
    "encode_stats",
    "merge_results",
    "merge_stats",
    "parse_result",
]

#: Prefix of the one stdout line that carries a worker's result.
MARKER = "CHAOS_INFER_WORKER_RESULT "


# -- histograms and counts ---------------------------------------------------------------------


def encode_stats(st: StreamStats) -> dict[str, Any]:
    """A JSON-able form of ``st``: every histogram HDR-encoded (compressed, base64), the counts."""
    return {
        "h": {k: h.encode().decode("ascii") for k, h in st.h.items() if h.get_total_count()},
        "n": st.n,
        "ok": st.ok,
        "timeouts": st.timeouts,
        "errors": st.errors,
        "first_sent": st.first_sent,
        "last_sent": st.last_sent,
        "by_class": st.by_class,
    }


def decode_stats(doc: Mapping[str, Any]) -> StreamStats:
    """Inverse of :func:`encode_stats`.

    Raises:
        ValueError: a malformed document or histogram.
    """
    st = StreamStats()
    try:
        for name, text in (doc.get("h") or {}).items():
            if name not in st.h:
                raise ValueError(f"unknown histogram {name!r}")
            st.h[name].decode_and_add(str(text).encode("ascii"))
        st.n, st.ok, st.timeouts = int(doc["n"]), int(doc["ok"]), int(doc["timeouts"])
        st.errors = {str(k): dict(v) for k, v in (doc.get("errors") or {}).items()}
        st.first_sent = doc.get("first_sent")
        st.last_sent = doc.get("last_sent")
        st.by_class = {str(k): int(v) for k, v in (doc.get("by_class") or {}).items()}
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed worker statistics: {exc}") from None
    return st


def merge_stats(parts: Iterable[StreamStats]) -> StreamStats:
    """Sum of shard statistics: histograms added bucket by bucket (exact), counts summed, the
    first/last send times widened, one sample error message kept per class."""
    out = StreamStats()
    for st in parts:
        for name, h in st.h.items():
            out.h[name].add(h)
        out.n += st.n
        out.ok += st.ok
        out.timeouts += st.timeouts
        for cls, info in st.errors.items():
            mine = out.errors.setdefault(cls, {"count": 0, "sample": info.get("sample")})
            mine["count"] += int(info.get("count") or 0)
        for cls, count in st.by_class.items():
            out.by_class[cls] = out.by_class.get(cls, 0) + count
        if st.first_sent is not None:
            out.first_sent = (
                st.first_sent if out.first_sent is None else min(out.first_sent, st.first_sent)
            )
        if st.last_sent is not None:
            out.last_sent = (
                st.last_sent if out.last_sent is None else max(out.last_sent, st.last_sent)
            )
    return out


def parse_result(text: str) -> dict[str, Any] | None:
    """The result in a worker's stdout or pod log (the last marker line), or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith(MARKER):
            try:
                doc = json.loads(line[len(MARKER) :])
            except ValueError:
                return None
            return doc if isinstance(doc, dict) else None
    return None


def merge_results(mode: str, results: Sequence[Mapping[str, Any]], n: int) -> dict[str, Any]:
    """One report from the workers' results (histograms merged exactly, counts summed).

    Returns:
        soak: ``{"mode", "workers", "shards", "stats"}`` (``StreamStats.summary`` of the merged
        statistics, ``valid``: every shard kept its schedule); three-phase: ``{"mode",
        "workers", "steps": [{"step", "kind", "start_at", "end_at", "stats", "acceptance",
        "passed", "flags"}], "passed", "flagged"}``, acceptance as ``measure.slo.evaluate``.

    Raises:
        ValueError: a malformed result.
    """
    if mode == "soak":
        merged = merge_stats(decode_stats(r["stats"]) for r in results)
        reports = [r.get("report") or {} for r in results]
        invalid = [str(x.get("invalid_reason")) for x in reports if not x.get("valid")]
        return {
            "mode": mode,
            "workers": n,
            "shards": [
                {"shard": r.get("shard"), **{k: v for k, v in (r.get("report") or {}).items()}}
                for r in results
            ],
            "valid": not invalid,
            "invalid_reason": invalid[0] if invalid else None,
            "stats": merged.summary(),
        }
    from chaoslib_infer.measure.slo import evaluate

    from .phases import flag_steps

    by_step: dict[str, list[Mapping[str, Any]]] = {}
    order: list[str] = []
    for r in results:
        for s in r.get("steps") or []:
            if s["step"] not in by_step:
                order.append(s["step"])
            by_step.setdefault(s["step"], []).append(s)
    steps: list[dict[str, Any]] = []
    for name in order:
        parts = by_step[name]
        st = merge_stats(decode_stats(p["stats"]) for p in parts)
        start = min(float(p["start_at"]) for p in parts)
        end = max(float(p["end_at"]) for p in parts)
        stats = st.summary()
        stats["ok_rps"] = stats["ok"] / max(end - start, 1e-9)
        rows = evaluate(stats)
        step: dict[str, Any] = {
            "step": name,
            "kind": parts[0]["kind"],
            "workers": len(parts),
            "start_at": start,
            "end_at": end,
            "stats": stats,
            "acceptance": rows,
            "passed": all(x["passed"] for x in rows),
            "flags": [],
        }
        rates = [float(p["rate_rps"]) for p in parts if p.get("rate_rps") is not None]
        if rates:
            step["rate_rps"] = math.fsum(rates)
        steps.append(step)
    flag_steps(steps)
    return {
        "mode": mode,
        "workers": n,
        "steps": steps,
        "passed": all(s["passed"] for s in steps),
        "flagged": any(s["flags"] for s in steps),
    }
