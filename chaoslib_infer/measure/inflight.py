"""Windows that see every request: attempts still on the wire count at judging time.

A record is written only when its attempt ends, so a window that selects the records *sent* in
it misses every request that is slow or hangs: one replica of three frozen, the ended records
read availability 1.0 while a third of the requests are stuck. The load process therefore keeps a
snapshot of the attempts on the wire (``inflight.json`` beside ``records.jsonl``, replaced every
0.25 s; :func:`chaoslib_infer.load.client.run_load`). Judging a window (``docs/definitions.md``,
"Windows that see every request"):

1. wait until every attempt sent in the window has ended, or has been in flight longer than the
   judging deadline (``deadline_s``, default the client's first-token timeout: a request without
   output for that long is a timeout by the acceptance table's definition);
2. count each attempt still in flight past the deadline as a timeout (class ``timeout_total``,
   ``in_flight_at_judging`` true), so a hang is visible before the client gives up on it.

The same holds after the run: an attempt *cut off* when the load stopped (``cut_off`` true,
outcome unknown, left out of the rates by ``metrics.select``) that had been in flight past the
deadline is a timeout, not an unknown (:func:`cut_off_timeouts`); otherwise a request hung when
the load ends would hide from the P99 and the timeout rate.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_DEADLINE_S",
    "cut_off_timeouts",
    "in_flight_timeouts",
    "judged_records",
    "read_inflight",
    "wait_for_window",
]

#: Judging deadline (s): the load client's default first-token timeout (``LoadSpec``).
DEFAULT_DEADLINE_S = 10.0

Record = Mapping[str, Any]


def read_inflight(path: Path) -> list[dict[str, Any]]:
    """The attempts of an in-flight snapshot: ``[{"request_id", "attempt", "intended_at",
    "sent_at"}]`` (unix seconds); ``[]`` when the file is missing or unreadable (a snapshot is
    replaced atomically, so a half-written one is never read)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    attempts = doc.get("attempts") if isinstance(doc, dict) else None
    if not isinstance(attempts, list):
        return []
    return [
        a
        for a in attempts
        if isinstance(a, dict)
        and isinstance(a.get("sent_at"), int | float)
        and isinstance(a.get("request_id"), str)
    ]


def in_flight_timeouts(
    inflight: Iterable[Mapping[str, Any]],
    records: Iterable[Record],
    now: float,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> list[dict[str, Any]]:
    """Timeout records for the attempts on the wire longer than ``deadline_s`` at ``now``.

    Args:
        inflight: snapshot attempts (:func:`read_inflight`).
        records: the records already written (an attempt that ended since the snapshot is not
            counted twice).
        now: judging time, unix seconds.
        deadline_s: how long an attempt may be in flight before it counts as a timeout.

    Returns:
        Records of class ``timeout_total`` with ``in_flight_at_judging`` true, ``end_at`` =
        ``now`` and ``in_flight_s`` (seconds on the wire so far).
    """
    ended = {(r.get("request_id"), r.get("attempt") or 1) for r in records}
    out: list[dict[str, Any]] = []
    for a in inflight:
        key = (a["request_id"], a.get("attempt") or 1)
        age = now - float(a["sent_at"])
        if key in ended or age <= deadline_s:
            continue
        out.append(
            {
                "request_id": a["request_id"],
                "attempt": int(a.get("attempt") or 1),
                "final": True,
                "intended_at": float(a.get("intended_at") or a["sent_at"]),
                "sent_at": float(a["sent_at"]),
                "status": None,
                "ok": False,
                "error_class": "timeout_total",
                "error": f"still in flight after {age:.1f} s at judging time",
                "first_byte_at": None,
                "first_token_at": None,
                "chunk_times": [],
                "end_at": now,
                "replica": None,
                "in_flight_at_judging": True,
                "in_flight_s": age,
            }
        )
    return out


def cut_off_timeouts(
    records: Iterable[Record], deadline_s: float = DEFAULT_DEADLINE_S
) -> list[dict[str, Any]]:
    """``records`` with every cut-off attempt past the judging deadline counted as a timeout.

    Args:
        records: attempt records, cut-off ones (``client.cut_off_record``) included.
        deadline_s: how long an attempt may be in flight before it counts as a timeout (s).

    Returns:
        Copies of the records; a cut-off record whose ``in_flight_s`` (else ``end_at -
        sent_at``) exceeds ``deadline_s`` becomes class ``timeout_total`` with ``cut_off``
        false, ``in_flight_at_judging`` true and ``cut_off_at_stop`` true (so the rates and
        percentiles count it); a younger one stays cut off (outcome unknown, left out).
    """
    out: list[dict[str, Any]] = []
    for r in records:
        rec = dict(r)
        if rec.get("cut_off"):
            age = rec.get("in_flight_s")
            if not isinstance(age, int | float):
                s, e = rec.get("sent_at"), rec.get("end_at")
                age = (
                    float(e) - float(s)
                    if isinstance(s, int | float) and isinstance(e, int | float)
                    else None
                )
            if age is not None and float(age) > deadline_s:
                rec.update(
                    cut_off=False,
                    cut_off_at_stop=True,
                    in_flight_at_judging=True,
                    ok=False,
                    error_class="timeout_total",
                    error=f"in flight for {float(age):.1f} s when the load stopped "
                    f"(past the {deadline_s:g} s judging deadline)",
                )
        out.append(rec)
    return out


def wait_for_window(
    inflight_path: Path,
    end: float,
    deadline_s: float = DEFAULT_DEADLINE_S,
    poll_s: float = 0.1,
    sleep: Any = time.sleep,
    clock: Any = time.time,
) -> float:
    """Block until every attempt sent before ``end`` has ended or passed ``deadline_s``.

    Args:
        inflight_path: the load's in-flight snapshot.
        end: window end, unix seconds (attempts sent at or after it are not waited for).
        deadline_s: the judging deadline (s).
        poll_s: seconds between snapshot reads.
        sleep, clock: injectable for tests.

    Returns:
        Seconds waited. At most ``deadline_s + 1`` (the snapshot's own refresh period included).
    """
    t0 = clock()
    limit = t0 + deadline_s + 1.0
    while clock() < limit:
        now = clock()
        waiting = [
            a
            for a in read_inflight(inflight_path)
            if float(a["sent_at"]) < end and now - float(a["sent_at"]) <= deadline_s
        ]
        if not waiting:
            break
        sleep(poll_s)
    return clock() - t0


def judged_records(
    records: list[dict[str, Any]],
    inflight: Iterable[Mapping[str, Any]],
    now: float,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> list[dict[str, Any]]:
    """``records`` plus :func:`in_flight_timeouts` at ``now``, cut-off attempts past the deadline
    counted as timeouts (:func:`cut_off_timeouts`): what a judged window counts."""
    return [
        *cut_off_timeouts(records, deadline_s),
        *in_flight_timeouts(inflight, records, now, deadline_s),
    ]
