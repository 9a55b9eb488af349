"""Which window judges each logical request, and what a request crossing the injection was doing.

The unit (``docs/definitions.md``, "The unit"): a window judges *logical requests* (one
``request_id``: the request with its client retries; it fails only when its final attempt
failed), each with all its attempts, so rates and counts of the same request never split
between two windows. A request belongs to the window in which its first attempt was sent
(``[start, end)``, unix seconds), except at the injection instant.

Attribution at the injection (``docs/definitions.md``, "Windows that see every request"): a
request first sent before the fault whose outcome is not settled when the fault comes (one of
its attempts is on the wire at the injection, or it waits between two attempts) goes by what it
was doing at that instant:

- the attempt on the wire was **healthy** at the injection (its first token had come, or its
  wait so far was still within the allowance that the baseline's own TTFT tail gives,
  :func:`ttft_allowance`): the request is the **fault's** (a stream the node loss cut, a request
  queued a moment before the kill);
- it was **overdue** (no first token, and waiting longer than the allowance): it was already
  stuck before the fault, and the request stays in the **baseline**, where it is judged as a
  baseline defect (a hang present from the start is never blamed on the fault);
- no attempt on the wire (between two attempts, in its backoff): the next attempt meets the
  fault: the **fault's**.

:func:`assign` returns each window's attempts and the count of attempts that crossed the instant
and where each went (the verdict's ``crossed_injection`` entry).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chaoslib_infer.measure.metrics import percentiles_s

__all__ = [
    "ALLOWANCE_FACTOR",
    "ALLOWANCE_FLOOR_S",
    "Assignment",
    "assign",
    "crossed_note",
    "healthy_at",
    "ttft_allowance",
]

#: The allowance is this multiple of the baseline's P99 TTFT: the factor the verdict already
#: accepts between the P99 after the drill and the baseline's (``p99_after_vs_baseline``).
ALLOWANCE_FACTOR = 2.0
#: ... and at least this (s): below it one request's scheduling jitter, not a hang, would decide
#: (a request sent a few tens of milliseconds before the kill is never "overdue").
ALLOWANCE_FLOOR_S = 0.5


def _t(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def ttft_allowance(
    records: Sequence[Mapping[str, Any]], fault_at: float, deadline_s: float
) -> tuple[float, float | None]:
    """How long an attempt may wait for its first token and still count as healthy.

    Args:
        records: attempt records (contracts.md section 3).
        fault_at: the injection, unix seconds.
        deadline_s: the judging deadline (s): an attempt waiting longer is a timeout anyway.

    Returns:
        ``(allowance_s, baseline_p99_ttft_s)``: ``ALLOWANCE_FACTOR`` x the P99 TTFT (HDR,
        :func:`chaoslib_infer.measure.metrics.percentiles_s`) of the successful attempts sent
        *and* ended before the injection (the baseline that no fault touched), at least
        :data:`ALLOWANCE_FLOOR_S`, at most ``deadline_s``; the P99 is None (the allowance then
        the floor) when no such attempt had a first token.
    """
    ttfts: list[float] = []
    for r in records:
        s, e, ft = _t(r.get("sent_at")), _t(r.get("end_at")), _t(r.get("first_token_at"))
        if r.get("ok") and s is not None and e is not None and ft is not None and e <= fault_at:
            ttfts.append(ft - s)
    p99 = percentiles_s(ttfts, (99,))[99]
    allowance = ALLOWANCE_FLOOR_S if p99 is None else max(ALLOWANCE_FACTOR * p99, ALLOWANCE_FLOOR_S)
    return min(allowance, float(deadline_s)), p99


def healthy_at(attempt: Mapping[str, Any], at: float, allowance_s: float) -> bool:
    """Whether ``attempt`` (on the wire at ``at``, unix s) was healthy then: its first token had
    come (``first_token_at <= at``), or it had waited no longer than ``allowance_s``."""
    ft = _t(attempt.get("first_token_at"))
    if ft is not None and ft <= at:
        return True
    sent = _t(attempt.get("sent_at"))
    return sent is None or at - sent <= allowance_s


@dataclass
class Assignment:
    """Each window's attempts, and the attempts that crossed the injection.

    Attributes:
        windows: ``{window name: attempt records}`` (copies; every attempt of each logical
            request assigned to the window).
        crossed: ``{"attempts", "to_fault", "to_baseline", "between_attempts", "allowance_s",
            "baseline_p99_ttft_s"}``: attempts on the wire at the injection, how many of their
            requests went to the fault window (healthy) and to the baseline (overdue), requests
            waiting between two attempts at it (the fault's), and the allowance used (s);
            empty without an injection.
    """

    windows: dict[str, list[dict[str, Any]]]
    crossed: dict[str, Any] = field(default_factory=dict)


def _groups(records: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    by: dict[str, list[Mapping[str, Any]]] = {}
    for k, r in enumerate(records):
        if _t(r.get("sent_at")) is None:
            continue
        rid = r.get("request_id")
        by.setdefault(str(rid) if rid is not None else f"<no request_id #{k}>", []).append(r)
    return list(by.values())


def assign(
    records: Sequence[Mapping[str, Any]],
    windows: Mapping[str, tuple[float, float]],
    fault_at: float | None,
    allowance_s: float = ALLOWANCE_FLOOR_S,
    baseline_p99_ttft_s: float | None = None,
) -> Assignment:
    """Assign every logical request (with all its attempts) to the windows that judge it.

    Args:
        records: attempt records; those without a numeric ``sent_at`` are left out.
        windows: ``{name: (start, end)}`` (unix s); ``drill`` takes every request, the others
            the requests first sent in ``[start, end)``, but for the crossing rule (module
            docstring) when ``fault_at`` is given and both ``baseline`` and ``fault`` exist.
        fault_at: the injection (unix s), or None.
        allowance_s: the TTFT allowance (:func:`ttft_allowance`).
        baseline_p99_ttft_s: the baseline's P99 TTFT, reported beside the allowance.

    Returns:
        The :class:`Assignment`.
    """
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in windows}
    crossing = fault_at is not None and "fault" in windows and "baseline" in windows
    crossed = {"attempts": 0, "to_fault": 0, "to_baseline": 0, "between_attempts": 0}
    for group in _groups(records):
        first = min(float(r["sent_at"]) for r in group)
        homes = [n for n, (a, b) in windows.items() if n == "drill" or a <= first < b]
        if crossing and fault_at is not None and first < fault_at and "baseline" in homes:
            ends = [_t(r.get("end_at")) for r in group]
            settled = all(e is not None and e <= fault_at for e in ends) and all(
                float(r["sent_at"]) < fault_at for r in group
            )
            if not settled:
                on_wire = [
                    r
                    for r, e in zip(group, ends, strict=True)
                    if float(r["sent_at"]) < fault_at and (e is None or e > fault_at)
                ]
                if on_wire:
                    crossed["attempts"] += len(on_wire)
                    to_fault = all(healthy_at(r, fault_at, allowance_s) for r in on_wire)
                    crossed["to_fault" if to_fault else "to_baseline"] += len(on_wire)
                else:
                    to_fault = True
                    crossed["between_attempts"] += 1
                if to_fault:
                    homes = [n for n in homes if n != "baseline"] + ["fault"]
        for name in homes:
            out[name].extend(dict(r) for r in group)
    info: dict[str, Any] = {}
    if crossing:
        info = {
            **crossed,
            "allowance_s": round(allowance_s, 4),
            "baseline_p99_ttft_s": baseline_p99_ttft_s,
        }
    return Assignment(out, info)


def crossed_note(crossed: Mapping[str, Any]) -> str | None:
    """The verdict's note on the attempts that crossed the injection (``crossed`` of
    :class:`Assignment`), in words, or None when none did."""
    if not crossed or not (crossed.get("attempts") or crossed.get("between_attempts")):
        return None
    p99 = crossed.get("baseline_p99_ttft_s")
    tail = (
        f"{ALLOWANCE_FACTOR:g}x the baseline's P99 TTFT {p99:.3g} s, "
        if isinstance(p99, float)
        else ""
    )
    return (
        f"crossed the injection: {crossed['attempts']} attempts in flight at it, "
        f"{crossed['to_fault']} to the fault (healthy: first token come, or waiting <= "
        f"{crossed['allowance_s']:.3g} s: {tail}at least {ALLOWANCE_FLOOR_S:g} s), "
        f"{crossed['to_baseline']} to the baseline (already overdue: a defect before the "
        f"fault); {crossed['between_attempts']} requests between two attempts, to the fault"
    )
