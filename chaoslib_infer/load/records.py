"""Load records: one JSON line per attempt (``docs/contracts.md`` section 3) and the shared clock.

Times in records are **unix seconds as float**. They are derived from a monotonic clock so that
intervals are immune to wall-clock steps, yet comparable with the lab's ground truth:
``unix_now() = T0_UNIX + (time.perf_counter() - T0_PERF)``, both captured once per process.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from chaoslib_infer.safety.redact import scrub

try:  # 5-7x faster than json.loads on records (float-heavy lines): a million in seconds
    import orjson
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is a dependency
    orjson = None  # type: ignore[assignment]
    _loads = json.loads  # type: ignore[assignment]

#: orjson refuses what the standard library would write differently (dataclasses, datetimes,
#: subclasses of str/int/float/dict/list): those records take the ``json.dumps`` path
_ORJSON_OPTS = (
    orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_APPEND_NEWLINE
    if orjson is not None
    else 0
)

__all__ = [
    "OPTIONAL_FIELDS",
    "RECORD_FIELDS",
    "T0_PERF",
    "T0_UNIX",
    "RecordWriter",
    "iter_records",
    "perf_to_unix",
    "read_records",
    "record_line",
    "scrub_record",
    "unix_now",
]

#: Record fields that hold text a server sent (scrubbed by :meth:`RecordWriter.write`).
_TEXT_FIELDS = ("error", "replica")

T0_UNIX: float = time.time()
T0_PERF: float = time.perf_counter()

#: Field names of one attempt record, in contract order (contracts.md section 3).
RECORD_FIELDS: tuple[str, ...] = (
    "request_id",
    "attempt",
    "final",
    "intended_at",
    "sent_at",
    "status",
    "ok",
    "error_class",
    "error",
    "first_byte_at",
    "first_token_at",
    "chunk_times",
    "end_at",
    "output_tokens",
    "tokens_source",
    "replica",
    "text_len",
)

#: Fields a record may carry after :data:`RECORD_FIELDS` (contracts.md section 3): the clock
#: (``time_source`` "kernel" | "loop", absent = "loop"; the kernel records' loop-time stamps), the
#: cut-off marks, the not-sent marks (``not_sent``, ``in_flight``: the number in flight when a
#: due request found the in-flight cap full), the OpenAI SDK client's marks (``client``:
#: "openai-sdk"; ``retry_after_s``: the ``Retry-After`` the answer carried, ``sdkclient``), the
#: prompt's size (``prompt_tokens``, and ``prompt_tokens_source`` "usage" | "estimate":
#: :mod:`chaoslib_infer.load.prompt_size`), and the chunk path that parsed the stream
#: (``chunk_path`` "compiled" | "python", ``measure.chunkpath``).
OPTIONAL_FIELDS: tuple[str, ...] = (
    "time_source",
    "chunk_path",
    "sent_source",
    "sent_at_loop",
    "first_byte_at_loop",
    "first_token_at_loop",
    "chunk_times_loop",
    "end_at_loop",
    "cut_off",
    "in_flight_s",
    "not_sent",
    "in_flight",
    "client",
    "retry_after_s",
    "prompt_tokens",
    "prompt_tokens_source",
)


def unix_now() -> float:
    """Current time in unix seconds, from the process's monotonic clock (see module docstring)."""
    return T0_UNIX + (time.perf_counter() - T0_PERF)


def perf_to_unix(perf: float) -> float:
    """Convert a ``time.perf_counter()`` reading (seconds) to unix seconds on the shared clock."""
    return T0_UNIX + (perf - T0_PERF)


def scrub_record(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its text fields (``error``, ``replica``: a server's words) scrubbed of the
    secrets this process knows (:func:`chaoslib_infer.safety.redact.scrub`); the same dict when
    nothing changed, else a shallow copy (the caller's dict is never modified)."""
    for field in _TEXT_FIELDS:
        value = record.get(field)
        if isinstance(value, str) and value:
            clean = scrub(value)
            if clean is not value:
                record = {**record, field: clean}
    return record


def _finite(obj: Any) -> bool:
    """True when no float inside ``obj`` (a dict, list or tuple, nested) is NaN or infinite."""
    for v in obj.values() if type(obj) is dict else obj:
        t = type(v)
        if t is float:
            if v - v != 0.0:  # NaN or an infinity
                return False
        elif t is list:
            if v and not _finite_list(v):
                return False
        elif (t is dict or t is tuple) and not _finite(v):
            return False
    return True


def _finite_list(values: list[Any]) -> bool:
    try:  # a list of numbers (chunk times): one C-level pass
        return math.isfinite(math.fsum(values))
    except (TypeError, ValueError, OverflowError):  # other items, inf - inf, huge finite values
        return _finite(values)


def record_line(record: dict[str, Any]) -> bytes:
    """``record`` as one compact JSON line (UTF-8, ``\\n``-terminated), what
    :meth:`RecordWriter.write` writes.

    The same JSON values as ``json.dumps(record, ensure_ascii=False, separators=(",", ":"),
    allow_nan=False)``: orjson writes the line (about 10x faster; float text may differ in form,
    ``1e-05`` against ``1e-5``, never in value) when the record holds only plain JSON types and
    finite floats; anything else takes the standard library's path, so its errors are the same.

    Raises:
        ValueError: a float in the record is NaN or infinite, or a string cannot be encoded
            (a lone surrogate).
        TypeError: a value is not JSON-serialisable.
    """
    if orjson is not None and _finite(record):
        try:
            return orjson.dumps(record, option=_ORJSON_OPTS)
        except TypeError:  # orjson.JSONEncodeError: big ints, surrogates, non-str keys, ...
            pass
    text = json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return (text + "\n").encode("utf-8")


class RecordWriter:
    """Append attempt records to a JSONL file, one line per record, flushed after each line.

    Use as a context manager. ``write`` is synchronous and takes a lock, so concurrent coroutines of
    one event loop (and threads) never interleave lines. A process killed mid-write leaves at most
    one truncated last line, which ``read_records`` skips.

    Args:
        path: output file; its parent directory must exist.
        append: append to an existing file instead of truncating it.
        fsync: also ``os.fsync`` after every record (slow; off by default, a flush survives a
            killed process but not a machine crash).

    Raises:
        OSError: the file cannot be opened.
    """

    def __init__(self, path: str | os.PathLike[str], append: bool = False, fsync: bool = False):
        self.path = Path(path)
        self._fsync = fsync
        self._lock = threading.Lock()
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
        fd = os.open(self.path, flags, 0o600)  # records may hold server text: owner only
        self._fh: IO[bytes] | None = open(fd, "ab" if append else "wb")  # noqa: SIM115
        self.count = 0

    def write(self, record: dict[str, Any]) -> None:
        """Serialise ``record`` as one JSON line and flush it.

        Text fields (``error``, ``replica``: a server's words) are scrubbed of the secrets this
        process knows (:func:`chaoslib_infer.safety.redact.scrub`) before the line is written.

        Raises:
            ValueError: the writer is closed, or the record is not JSON-serialisable.
        """
        line = record_line(scrub_record(record))
        with self._lock:
            if self._fh is None:
                raise ValueError("RecordWriter is closed")
            self._fh.write(line)
            self._fh.flush()
            if self._fsync:
                os.fsync(self._fh.fileno())
            self.count += 1

    def close(self) -> None:
        """Flush and close the file; idempotent."""
        with self._lock:
            if self._fh is not None:
                self._fh.flush()
                self._fh.close()
                self._fh = None

    @property
    def closed(self) -> bool:
        """True once ``close`` has been called."""
        return self._fh is None

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def iter_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the records of a JSONL file, streaming line by line (constant memory); see
    ``read_records`` for the tolerance rules."""
    bad: int | None = None
    with open(path, "rb") as fh:
        for i, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            if bad is not None:
                raise ValueError(f"{path}: line {bad} is not valid JSON")
            try:
                obj = _loads(raw)
            except ValueError:
                bad = i  # tolerated only when nothing but blank lines follows
                continue
            if not isinstance(obj, dict):
                raise ValueError(f"{path}: line {i} is not a JSON object")
            yield obj


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read every record of a JSONL records file.

    A truncated or otherwise unparsable **last** line (a writer killed mid-line) is skipped; blank
    lines are ignored.

    Args:
        path: the records file.

    Returns:
        The records as dicts, in file order.

    Raises:
        OSError: the file cannot be read.
        ValueError: a line other than the last one is not a JSON object.
    """
    return list(iter_records(path))
