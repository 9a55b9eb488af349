"""What a load run leaves of its attempts on the wire: the in-flight snapshot
(:data:`INFLIGHT_FILE`, :func:`write_inflight`, rewritten by ``run_load`` as attempts start and
end), the ``cut_off`` record of an attempt the stop cut short (:func:`cut_off_record`), the
``not_sent`` record of a request due while the in-flight cap was full (:func:`not_sent_record`),
and the default cap itself, sized from the plan (:func:`plan_cap`).

Split out of :mod:`chaoslib_infer.load.client`, which re-exports these names (import paths kept).
"""

from __future__ import annotations

import bisect
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .attempts import CUT_OFF, NOT_SENT

__all__ = [
    "INFLIGHT_FILE",
    "MIN_PLAN_CAP",
    "cut_off_record",
    "not_sent_record",
    "plan_cap",
    "write_inflight",
]

#: Name of the in-flight snapshot written beside the records (``run_load(inflight_path=...)``).
INFLIGHT_FILE = "inflight.json"
#: The smallest in-flight cap :func:`plan_cap` gives (requests).
MIN_PLAN_CAP = 1000


def plan_cap(offsets: Sequence[float], deadline_s: float, floor: int = MIN_PLAN_CAP) -> int:
    """The default in-flight cap of an open-loop run: the plan's rate x the request deadline,
    counted on the schedule itself, at least ``floor``.

    A logical request holds its slot at most ``deadline_s`` (every attempt at its timeout and
    every backoff: ``LoadSpec.max_logical_s``), so a client that keeps up never has more in flight
    than the most arrivals of any ``deadline_s``-long stretch of the schedule; a cap of that size
    fills only when the client itself is late, never because the service holds requests up to
    their deadline (``docs/definitions.md``, "Send time").

    Args:
        offsets: the arrival schedule, seconds from the start, ascending.
        deadline_s: the longest a logical request can take (s, > 0).
        floor: the least cap returned.

    Returns:
        ``max(floor, most arrivals in any window [t, t + deadline_s))``.
    """
    most = 0
    for i, t in enumerate(offsets):
        most = max(most, bisect.bisect_left(offsets, t + deadline_s, lo=i) - i)
    return max(int(floor), most)


def not_sent_record(
    request_id: str, intended_at: float, found_at: float, in_flight: int, cap: int
) -> dict[str, Any]:
    """The record of a request the open-loop schedule made due while the in-flight cap was full.

    Nothing went on the wire: the service held every slot (or the client, when it was itself
    late; the verdict tells them apart by the client's own lag).

    Args:
        request_id: logical request id.
        intended_at: when it was due (unix s). found_at: when the client found the cap full
            (unix s): its ``sent_at`` and ``end_at``, so windows by send time hold it where it
            was due (the difference is the client's own schedule lag).
        in_flight: logical requests in flight at that moment. cap: the in-flight cap.

    Returns:
        A record of ``docs/contracts.md`` section 3: ``ok`` false, ``error_class``
        ``"not_sent"``, ``not_sent`` true, ``in_flight`` (the number in flight), ``status``
        None, no chunks.
    """
    return {
        "request_id": request_id,
        "attempt": 1,
        "final": True,
        "intended_at": intended_at,
        "sent_at": found_at,
        "status": None,
        "ok": False,
        "error_class": NOT_SENT,
        "error": f"not sent: the in-flight cap ({cap}) was full ({in_flight} in flight)",
        "first_byte_at": None,
        "first_token_at": None,
        "chunk_times": [],
        "end_at": found_at,
        "output_tokens": 0,
        "tokens_source": "chunks",
        "replica": None,
        "text_len": 0,
        "not_sent": True,
        "in_flight": in_flight,
    }


def cut_off_record(
    request_id: str, attempt: int, intended_at: float, sent_at: float, cut_at: float
) -> dict[str, Any]:
    """The record of an attempt still in flight when the load stopped (class ``cut_off``).

    Args:
        request_id: logical request id. attempt: attempt number (1-based).
        intended_at, sent_at, cut_at: unix seconds (schedule, send, the stop).

    Returns:
        A record of ``docs/contracts.md`` section 3 with ``ok`` false, ``error_class``
        ``"cut_off"``, ``cut_off`` true, ``in_flight_s`` (seconds on the wire) and ``end_at`` =
        ``cut_at``; its outcome is unknown, so the rates leave it out (``metrics.select``).
    """
    age = max(0.0, cut_at - sent_at)
    return {
        "request_id": request_id,
        "attempt": attempt,
        "final": True,
        "intended_at": intended_at,
        "sent_at": sent_at,
        "status": None,
        "ok": False,
        "error_class": CUT_OFF,
        "error": f"in flight for {age:.3f} s when the load stopped; outcome unknown",
        "first_byte_at": None,
        "first_token_at": None,
        "chunk_times": [],
        "end_at": cut_at,
        "output_tokens": 0,
        "tokens_source": "chunks",
        "replica": None,
        "text_len": 0,
        "cut_off": True,
        "in_flight_s": age,
    }


def write_inflight(path: Path, on_wire: dict[tuple[str, int], tuple[float, float]]) -> None:
    """Atomically replace ``path`` with the in-flight snapshot (``run_load`` docstring).

    Args:
        path: the snapshot file. on_wire: ``{(request_id, attempt): (intended_at, sent_at)}``.

    Raises:
        OSError: the file cannot be written.
    """
    doc = {
        "t": time.time(),
        "attempts": [
            {"request_id": rid, "attempt": n, "intended_at": due, "sent_at": sent}
            for (rid, n), (due, sent) in on_wire.items()
        ],
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(json.dumps(doc, separators=(",", ":")).encode())
    os.replace(tmp, path)
