"""What a load run leaves of its attempts still on the wire: the in-flight snapshot
(:data:`INFLIGHT_FILE`, :func:`write_inflight`, rewritten by ``run_load`` as attempts start and
end) and the ``cut_off`` record of an attempt the stop cut short (:func:`cut_off_record`).

Split out of :mod:`chaoslib_infer.load.client`, which re-exports these names (import paths kept).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .attempts import CUT_OFF

__all__ = ["INFLIGHT_FILE", "cut_off_record", "write_inflight"]

#: Name of the in-flight snapshot written beside the records (``run_load(inflight_path=...)``).
INFLIGHT_FILE = "inflight.json"


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
