"""What a client that itself fell behind takes out of the judgement (``docs/definitions.md``,
"Send time" and "Verdicts").

A client short of CPU or late on its own loop (a failed :data:`~.state.CLIENT_LAG` row) can
fill its own in-flight cap, and, when its lag is large against its timeouts, give up on replies
that the service had already sent. Those outcomes are then not the service's:

* the requests it did not send (``not_sent``) are always left out;
* its timeouts are left out too when its own lag P99 (the larger of its read lag and its send
  lag) reaches :data:`CLIENT_TIMEOUT_SHARE` of the judging deadline: below that, a lag of ``L``
  can only turn a reply that came within ``L`` of the deadline into a timeout, and the timeouts
  stay the service's.

Both are counted in the note of their rows, which read ``n/a``. What is left (5xx, wrong or
empty content, resets, duplicates...) is what the service answered, whatever the client's
timing; the verdict judges it (:func:`~.state.decide_state`: failed outranks the client's
inconclusive reason on it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chaoslib_infer.measure.metrics import TIMEOUT_CLASSES

from .facts import format_value, num
from .state import CLIENT_LAG

__all__ = [
    "CLIENT_TIMEOUT_SHARE",
    "TIMEOUT_ROWS",
    "client_lag",
    "left_out",
    "mark_left_out",
]

#: The client's own lag P99, as a share of the judging deadline, from which its timeouts are not
#: the service's evidence (0.1: 1 s for the default 10 s deadline).
CLIENT_TIMEOUT_SHARE = 0.1
#: Rows that count timeouts: ``n/a`` when the client's timeouts are left out.
TIMEOUT_ROWS = frozenset({"timeout_rate", "timeout_rate_fault", "timeouts_fault", "hung_requests"})


def client_lag(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The client's own lag: the largest value of the failed :data:`~.state.CLIENT_LAG` rows
    (seconds), or None when none failed."""
    lags = [
        v
        for r in rows
        if r["criterion"] in CLIENT_LAG and r["result"] == "fail"
        for v in [num(r["value"])]
        if v is not None
    ]
    return max(lags) if lags else None


def left_out(
    records: Sequence[Mapping[str, Any]], timeouts: bool
) -> tuple[list[dict[str, Any]], int, int]:
    """``records`` without the ``not_sent`` ones and, with ``timeouts``, without the attempts of
    a timeout class (a cut-off one past the deadline included, already a ``timeout_total``).

    Returns:
        ``(kept, not_sent, timed_out)``: the records kept and the counts left out.
    """
    kept: list[dict[str, Any]] = []
    not_sent = timed_out = 0
    for r in records:
        if r.get("not_sent"):
            not_sent += 1
        elif timeouts and not r.get("ok") and r.get("error_class") in TIMEOUT_CLASSES:
            timed_out += 1
        else:
            kept.append(dict(r))
    return kept, not_sent, timed_out


def mark_left_out(
    rows: list[dict[str, Any]], not_sent: int, timed_out: int | None, lag: float
) -> list[dict[str, Any]]:
    """``rows`` (judged without the records :func:`left_out` left out) with the ``not_sent``
    row, and with ``timed_out`` not None the :data:`TIMEOUT_ROWS`, read ``n/a`` and their note
    saying what was left out and why.

    Args:
        rows: the judged rows. not_sent, timed_out: the counts left out (timed_out None: the
            timeouts were kept). lag: the client's own lag P99 (s).
    """
    why = f"the client itself fell behind (its lag P99 {format_value(lag, 's')})"
    for r in rows:
        if r["criterion"] == "not_sent":
            note = f"{why}: {not_sent} requests not sent, not counted against the service"
            r.update(value=float(not_sent), result="n/a", note=note)
        elif timed_out is not None and r["criterion"] in TIMEOUT_ROWS:
            note = (
                f"{why}: {timed_out} timed-out attempts left out (it may have given up on "
                "replies already sent)"
            )
            r.update(value=None, result="n/a", note=note)
    return rows
