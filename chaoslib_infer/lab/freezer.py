"""Where the upstream-timeout drill's freezer lives: the freezer cgroup hierarchy this process can
write (:func:`find_freezer`, v1 ``freezer`` controller or cgroup v2), a process's freezer cgroup
(:func:`pid_cgroup`), and the small ``/proc`` and control-file helpers the freeze uses.

Split out of :mod:`chaoslib_infer.lab.freeze` (the freeze, its undo and its dead-man), which
re-exports :data:`FREEZERS` and :func:`find_freezer` (import paths kept).
"""

from __future__ import annotations

import os
from pathlib import Path

from chaoslib_infer.lab import procfs
from chaoslib_infer.lab.cgroups import join, read_mounts, read_self_cgroups
from chaoslib_infer.lab.statedir import LabError

__all__ = [
    "FREEZERS",
    "find_freezer",
    "is_stopped",
    "pid_cgroup",
    "read_control",
    "same_process",
    "write_control",
]

FREEZERS = ("auto", "v1", "v2")


# --------------------------------------------------------------------------------------------
# /proc helpers
# --------------------------------------------------------------------------------------------
def same_process(pid: int, starttime: int | None) -> bool:
    """True when ``pid`` is alive (not a zombie) and, given ``starttime`` (``/proc/<pid>/stat``
    field 22), still the process that had it (not a reused pid)."""
    st = procfs.start_time(pid)
    return st is not None and (starttime is None or st == starttime) and procfs.state(pid) != "Z"


def is_stopped(pid: int) -> bool:
    """True when ``pid`` is stopped by a signal (state ``T``) or traced (``t``)."""
    return procfs.state(pid) in ("T", "t")


def write_control(path: Path, value: str) -> None:
    """Write ``value`` to a cgroup control file.

    Raises:
        LabError: the write failed (one line: the value, the file, the reason).
    """
    try:
        with open(path, "w") as fh:
            fh.write(value)
    except OSError as exc:
        raise LabError(f"cannot write {value.strip()!r} to {path}: {exc.strerror}") from exc


def read_control(path: Path) -> str | None:
    """A control file's text, stripped; None when it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


# --------------------------------------------------------------------------------------------
# Freezer discovery
# --------------------------------------------------------------------------------------------
def pid_cgroup(pid: int | str, version: int) -> Path | None:
    """Directory of ``pid``'s freezer cgroup (v1 ``freezer`` controller or v2 unified)."""
    try:
        v1, v2 = read_self_cgroups(Path(f"/proc/{pid}/cgroup"))
        mounts = read_mounts(Path(f"/proc/{pid}/mountinfo"))
    except OSError:
        return None
    for m in mounts:
        if version == 1 and m.fstype == "cgroup" and "freezer" in m.options and "freezer" in v1:
            return join(m, v1["freezer"])
        if version == 2 and m.fstype == "cgroup2" and v2 is not None:
            return join(m, v2)
    return None


def find_freezer(prefer: str = "auto") -> tuple[int, Path] | None:
    """Where this process can create freezer cgroups.

    Args:
        prefer: ``"auto"`` (v1 ``freezer`` controller first, then cgroup v2), ``"v1"`` or ``"v2"``.

    Returns:
        ``(version, base directory)``, or None when no writable freezer hierarchy exists.
    """
    order = {"auto": (1, 2), "v1": (1,), "v2": (2,)}.get(prefer)
    if order is None:
        raise LabError(f"freezer must be one of {', '.join(FREEZERS)}, got {prefer!r}")
    for version in order:
        base = pid_cgroup("self", version)
        if base is None or not os.access(base, os.W_OK):
            continue
        marker = "freezer.state" if version == 1 else "cgroup.procs"
        # v1: the root freezer cgroup has no freezer.state, but its children do
        if version == 1 or (base / marker).exists():
            return version, base
    return None
