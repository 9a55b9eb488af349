"""Recorded traces as the arrival schedule and request sizes (trace replay).

Format: the Mooncake / AIPerf trace, one JSON object per line::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}

* ``timestamp``: arrival time in **milliseconds** (any origin; the replay starts at the earliest
  one, so the first request is sent at offset 0).
* ``input_length``: prompt length in tokens (>= 1); ``output_length``: tokens asked (``max_tokens``,
  >= 1).
* ``hash_ids`` (optional): ids of the prompt's blocks of ``block_size`` tokens (512 in Mooncake);
  two requests that share a leading run of ids share that prefix (what prefix caches exploit).
  Other keys (``session_id``, ``text_input``, ...) are ignored.

Replay (``LoadSpec(trace=PATH, trace_speed=S)``): request *i* is due at
``(timestamp_i - timestamp_0) / 1000 / S`` seconds after the start (``S`` = 2 plays the trace twice
as fast), open loop from that absolute schedule, so the schedule lag (``sent_at - intended_at``)
is measured as for the built-in schedules. Its prompt is ``input_length`` words (one word of the
client's vocabulary per token: exact for the lab engine, an approximation for a real tokenizer):
the words of its hash-id blocks first (block *h* is the same words in every request; seeded by
*h*), then the random nonce (a response cache can never answer), then random words up to the
length; ``max_tokens`` is ``output_length``. For exact output lengths on vLLM add
``extra_body={"ignore_eos": true}``.
"""

from __future__ import annotations

import json
import math
import os
import random
import secrets
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .mix import PROMPT_WORDS

__all__ = [
    "BLOCK_SIZE",
    "TraceRequest",
    "read_trace",
    "trace_offsets",
    "trace_summary",
]

#: Tokens per hash-id block (Mooncake's block size).
BLOCK_SIZE = 512
_MAX_LINES = 10_000_000


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace: ``timestamp_ms`` as in the file, sizes in tokens."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()


def _int(name: str, v: Any, where: str, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{where}: {name} must be an integer >= {minimum}, got {v!r}")
    if v != int(v) or v < minimum:
        raise ValueError(f"{where}: {name} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def read_trace(path: str | os.PathLike[str]) -> list[TraceRequest]:
    """Read a Mooncake / AIPerf JSONL trace (module docstring), sorted by timestamp (stable).

    Args:
        path: the trace file; blank lines are skipped.

    Returns:
        The requests in arrival order.

    Raises:
        ValueError: unreadable file, a line that is not a JSON object, a missing or invalid
            field, or no request at all (one line naming the file and line number).
    """
    p = Path(path)
    out: list[TraceRequest] = []
    try:
        fh = p.open("rb")
    except OSError as exc:
        raise ValueError(f"trace {p}: cannot read: {exc.strerror or exc}") from None
    with fh:
        for i, raw in enumerate(fh, 1):
            if i > _MAX_LINES:
                raise ValueError(f"trace {p}: more than {_MAX_LINES} lines")
            if not raw.strip():
                continue
            where = f"trace {p} line {i}"
            try:
                obj = json.loads(raw)
            except ValueError:
                raise ValueError(f"{where}: not valid JSON") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{where}: not a JSON object")
            for key in ("timestamp", "input_length", "output_length"):
                if key not in obj:
                    raise ValueError(f"{where}: missing {key!r}")
            ts = obj["timestamp"]
            if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
                raise ValueError(f"{where}: timestamp must be a number (ms), got {ts!r}")
            if ts < 0:
                raise ValueError(f"{where}: timestamp must be >= 0 ms, got {ts!r}")
            hids = obj.get("hash_ids") or []
            if not isinstance(hids, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in hids
            ):
                raise ValueError(f"{where}: hash_ids must be a list of integers, got {hids!r}")
            out.append(
                TraceRequest(
                    float(ts),
                    _int("input_length", obj["input_length"], where, 1),
                    _int("output_length", obj["output_length"], where, 1),
                    tuple(hids),
                )
            )
    if not out:
        raise ValueError(f"trace {p}: no request in it")
    out.sort(key=lambda r: r.timestamp_ms)
    return out


def _check_speed(speed: float) -> float:
    ok = isinstance(speed, int | float) and not isinstance(speed, bool) and math.isfinite(speed)
    if not ok or speed <= 0:
        raise ValueError(f"trace speed must be a finite number > 0, got {speed!r}")
    return float(speed)


def trace_offsets(trace: list[TraceRequest], speed: float = 1.0) -> list[float]:
    """Arrival offsets in seconds from the start: ``(timestamp - first) / 1000 / speed``.

    Raises:
        ValueError: ``speed`` not a finite number > 0.
    """
    s = _check_speed(speed)
    t0 = trace[0].timestamp_ms if trace else 0.0
    return [(r.timestamp_ms - t0) / 1000.0 / s for r in trace]


def trace_summary(trace: list[TraceRequest], speed: float = 1.0) -> dict[str, Any]:
    """``{"requests", "duration_s" (scaled), "rate_rps" (mean, scaled), "speed",
    "input_tokens", "output_tokens", "shared_prefix_requests"}`` of a trace (a request whose
    first hash id also starts an earlier request counts as sharing a prefix).

    Raises:
        ValueError: ``speed`` not a finite number > 0.
    """
    offs = trace_offsets(trace, speed)
    dur = offs[-1] if offs else 0.0
    seen: set[int] = set()
    shared = 0
    for r in trace:
        if r.hash_ids:
            shared += r.hash_ids[0] in seen
            seen.add(r.hash_ids[0])
    return {
        "requests": len(trace),
        "duration_s": dur,
        "rate_rps": len(trace) / dur if dur > 0 else float(len(trace)),
        "speed": _check_speed(speed),
        "input_tokens": sum(r.input_length for r in trace),
        "output_tokens": sum(r.output_length for r in trace),
        "shared_prefix_requests": shared,
    }


@lru_cache(maxsize=4096)
def _block(hash_id: int, block_size: int) -> tuple[str, ...]:
    rng = random.Random(f"trace-block:{hash_id}")
    return tuple(rng.choice(PROMPT_WORDS) for _ in range(block_size))


def trace_prompt(req: TraceRequest, rng: random.Random, block_size: int = BLOCK_SIZE) -> str:
    """The prompt of one trace request: ``input_length`` words, hash-id blocks first, then the
    random nonce, then random words (module docstring)."""
    n = req.input_length
    words: list[str] = []
    for h in req.hash_ids:
        if len(words) >= n - 1:
            break
        words.extend(_block(h, block_size))
    del words[max(n - 1, 0) :]
    words.append(f"[{secrets.token_hex(8)}]")
    words.extend(rng.choice(PROMPT_WORDS) for _ in range(n - len(words)))
    return " ".join(words)
