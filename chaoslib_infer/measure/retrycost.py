"""What retries cost: duplicate generations, wasted tokens and retry amplification.

Definitions (``docs/definitions.md``, "Drill figures" and "The unit"): a retry is paid when the
engine generates the same logical request (``request_id``) more than once. The client's attempt
records say how often each request was *sent*; the engine's generation ledger
(``docs/contracts.md`` section 1: a ``generation`` line when a generation starts, a
``generation_end`` line with its prompt and completion tokens when it ends) says how often it was
*generated*. Both the client (its retry policy) and the gateway (HAProxy's ``retries`` /
``redispatch``, nginx's ``proxy_next_upstream``, LiteLLM's fallbacks) can retry; the ledger sees
both. Every drill judges these figures when the client or the gateway retried
(:func:`retried`), with the network-jitter drill's budgets as defaults.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from chaoslib_infer.measure.metrics import retry_stats

__all__ = ["generation_counts", "retried", "retry_cost", "wasted_tokens"]

Record = Mapping[str, Any]


def generation_counts(
    ledger: Iterable[Mapping[str, Any]], start: float | None = None, end: float | None = None
) -> dict[str, int]:
    """``{request_id: generations}`` over ledger ``generation`` lines with ``start <= t < end``
    (unix seconds; None: open)."""
    counts: dict[str, int] = {}
    for e in ledger:
        if e.get("event", "generation") != "generation":
            continue
        t = e.get("t")
        if not isinstance(t, int | float):
            continue
        if (start is not None and t < start) or (end is not None and t >= end):
            continue
        rid = e.get("request_id")
        if isinstance(rid, str):
            counts[rid] = counts.get(rid, 0) + 1
    return counts


def wasted_tokens(
    ledger: Iterable[Mapping[str, Any]], generations: Mapping[str, int]
) -> dict[str, Any]:
    """Tokens the engine spent on the duplicate generations counted in ``generations``.

    A logical request generated ``n > 1`` times is paid ``n`` times for one answer: every
    generation but the largest one (prompt + completion tokens, from the engine's
    ``generation_end`` ledger lines, contracts.md section 1) is waste. Prefill counts: a retry
    recomputes the whole prompt.

    Args:
        ledger: engine ledger lines (``generation_end`` events are read; others are skipped).
        generations: ``{request_id: generations}`` of this run's logical requests
            (:func:`generation_counts` over the same ledger, other clients' ids left out).

    Returns:
        ``{"wasted_tokens": int | None, "wasted_completion_tokens": int | None,
        "duplicate_generations_without_end": int}``: the totals are None (unmeasured, never 0)
        when the ledger holds generations but no ``generation_end`` line at all (an engine that
        does not write them), or when a duplicated request has a generation without its end
        line (a killed process, a generation still running): the waste is not known then.
    """
    dups = {rid: n for rid, n in generations.items() if n > 1}
    ends: dict[str, list[tuple[int, int]]] = {}
    any_end = False
    for e in ledger:
        if e.get("event") != "generation_end":
            continue
        any_end = True
        rid, pt, ct = e.get("request_id"), e.get("prompt_tokens"), e.get("completion_tokens")
        if rid in dups and isinstance(pt, int) and isinstance(ct, int):
            ends.setdefault(str(rid), []).append((pt, ct))
    missing = sum(max(0, n - len(ends.get(rid, []))) for rid, n in dups.items())
    if (generations and not any_end) or missing:
        return {
            "wasted_tokens": None,
            "wasted_completion_tokens": None,
            "duplicate_generations_without_end": missing,
        }
    total = completion = 0
    for rid in dups:
        gens = sorted(ends[rid], key=lambda g: g[0] + g[1])
        total += sum(pt + ct for pt, ct in gens[:-1])
        completion += sum(ct for _, ct in gens[:-1])
    return {
        "wasted_tokens": total,
        "wasted_completion_tokens": completion,
        "duplicate_generations_without_end": 0,
    }


def retry_cost(records: Iterable[Record], ledger: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The retry figures of one drill: what the client sent again and how many generations the
    engine ran per attempt. The duplicate generations and their tokens are not counted here:
    one computation leaves the fault's re-runs out of them
    (:func:`chaoslib_infer.measure.rerun.rerun_split`).

    Args:
        records: the drill's attempt records (``request_id``, ``attempt``; contracts.md
            section 3). Only their request ids select ledger lines: the ledger may hold other
            drills' and other clients' traffic.
        ledger: the engine's generation ledger lines (the lab's ``ledger.jsonl``; [] off the
            lab).

    Returns:
        Client side (always measured): ``retries`` (attempt records after the first of their
        request), ``retried_requests``, ``succeeded_after_retry``
        (:func:`chaoslib_infer.measure.metrics.retry_stats`). Engine side, None (unmeasured,
        never 0) when the ledger holds no ``generation`` line for any of these requests:
        ``retry_amplification`` (the largest, over the requests, of generations / client
        attempts: above 1.0 something between the client and the engine, the gateway, re-sent
        an attempt that was already generating) and ``generations_per_attempt`` (all
        generations / all attempts).
    """
    recs = list(records)
    rs = retry_stats(recs)
    attempts: dict[str, int] = {}
    for r in recs:
        rid = r.get("request_id")
        if rid is not None:
            attempts[str(rid)] = attempts.get(str(rid), 0) + 1
    counts = {rid: n for rid, n in generation_counts(ledger).items() if rid in attempts}
    out: dict[str, Any] = {
        "retries": int(rs["retries"]),
        "retried_requests": int(rs["retried_requests"]),
        "succeeded_after_retry": int(rs["succeeded_after_retry"]),
        "retry_amplification": None,
        "generations_per_attempt": None,
    }
    if counts:
        n_attempts = sum(attempts.values())
        out["retry_amplification"] = round(max(n / attempts[rid] for rid, n in counts.items()), 4)
        out["generations_per_attempt"] = round(sum(counts.values()) / n_attempts, 4)
    return out


def retried(figures: Mapping[str, Any], records: Iterable[Record]) -> bool:
    """Whether the client or the gateway retried in this drill: an attempt after the first of
    its request (the records, or the ``retries`` figure), a gateway retry in its log
    (``gateway_retries``), a request the engine generated more than once
    (``duplicate_generations`` / ``duplicates``: someone sent it again), or a retry
    amplification above 1.0. The retry-cost criteria apply only then (``n/a`` otherwise)."""

    def pos(key: str) -> bool:
        v = figures.get(key)
        return isinstance(v, int | float) and not isinstance(v, bool) and v > 0

    if any(pos(k) for k in ("retries", "gateway_retries", "duplicate_generations", "duplicates")):
        return True
    amp = figures.get("retry_amplification")
    if isinstance(amp, int | float) and not isinstance(amp, bool) and amp > 1.0:
        return True
    return any(int(r.get("attempt") or 1) > 1 for r in records)
