"""Helpers shared by the lab tests (imported as ``from labutil import ...``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """True if ``pid`` is a live process (zombies and dead processes count as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def alive_pids(pids: Iterable[int]) -> list[int]:
    """The pids of ``pids`` that are still live processes (see :func:`pid_alive`)."""
    return [pid for pid in pids if pid_alive(pid)]
