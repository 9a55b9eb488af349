"""What ``/proc`` says about one process: its state, start time and command line.

The lab and the safety layer recognise their own processes by these (a reused pid has a
different start time; a helper is known by its command line), so they read them one way.
Definitions: proc(5), ``/proc/<pid>/stat`` fields 3 (state) and 22 (starttime, clock ticks
since boot) and ``/proc/<pid>/cmdline``.
"""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["cmdline", "start_time", "stat_fields", "state"]


def stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (index 0 = state, index 19 =
    starttime), or None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def state(pid: int) -> str | None:
    """One-letter process state (``R``, ``S``, ``D``, ``T``, ``Z`` ...), None when gone."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


def start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22), None when gone: tells a
    reused pid apart."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def cmdline(pid: int, settle_s: float = 0.5) -> str:
    """``pid``'s command line, each argument followed by one space (``/proc`` ends each with a
    NUL); "" when it is gone.

    A process in the middle of ``execve`` reads an empty command line for a moment: the kernel
    closes the close-on-exec pipe that ``subprocess.Popen`` waits on before it sets up the new
    arguments, so ``Popen`` can return before ``/proc/<pid>/cmdline`` has them. An empty read of
    a live, non-zombie process is therefore retried for up to ``settle_s`` seconds (a kernel
    thread, whose command line stays empty, costs that wait once).
    """
    deadline = time.monotonic() + settle_s
    while True:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return ""
        if raw or time.monotonic() >= deadline or state(pid) in (None, "Z", "X"):
            return raw.replace(b"\0", b" ").decode(errors="replace")
        time.sleep(0.005)
