"""The lab's ground truth: what happened, when, written by the lab itself.

- ``events.jsonl`` (:mod:`chaoslib_infer.lab.recorder` writes start / ready / exit; the lab and the
  fault modules append ``fault`` records and their own events): :func:`events`, :func:`fault_event`;
- the first request a replica served after a time, from the engine ledger (``ledger.jsonl``,
  generation start) and HAProxy's request log (the request reached the server): :func:`served`.

A leaf module (it takes a state directory, never a ``Lab``). All times are unix seconds.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.lab.recorder import EVENTS_FILE, append_event, read_events
from chaoslib_infer.lab.statedir import LEDGER_FILE, REQUEST_LOG

__all__ = ["EVENT_FIELDS", "events", "fault_event", "served"]

#: fields of a fault record copied into its ``injected`` ground-truth event (never secrets)
EVENT_FIELDS = ("mode", "node", "port", "host")


def events(state_dir: Path) -> list[dict[str, Any]]:
    """Ground-truth records from ``state_dir/events.jsonl`` in file order."""
    return read_events(state_dir / EVENTS_FILE)


def fault_event(
    state_dir: Path, replica: str | None, phase: str, kind: str | None = "oom-kill", **extra: Any
) -> None:
    """Append a ``{"t", "event": "fault", "kind", "replica", "phase", ...extra}`` event."""
    append_event(
        state_dir / EVENTS_FILE,
        {
            "t": time.time(),
            "event": "fault",
            "kind": kind,
            "replica": replica,
            "phase": phase,
            **extra,
        },
    )


def served(state_dir: Path, replica: str, after: float) -> float | None:
    """Unix time of the first request ``replica`` served after ``after`` (None if none yet).

    Combines the engine ledger (generation start) and HAProxy's request log (time the request
    reached the server, 2xx/3xx answers only); the earliest wins.
    """
    best: float | None = None
    try:
        with open(state_dir / LEDGER_FILE) as fh:
            for line in fh:
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if (
                    entry.get("replica") != replica
                    or entry.get("event", "generation") != "generation"
                ):
                    continue
                t = float(entry.get("t", 0.0))
                if t > after and (best is None or t < best):
                    best = t
    except FileNotFoundError:
        pass
    for rec in hap.parse_request_log(state_dir / REQUEST_LOG):
        if rec.server != replica or not 200 <= rec.status < 400:
            continue
        t2 = rec.forwarded_t
        if t2 is not None and t2 > after and (best is None or t2 < best):
            best = t2
    return best
