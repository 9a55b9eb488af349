"""Memory cgroups for lab replicas (cgroup v1 memory controller or cgroup v2 with ``memory``).

The lab creates its cgroups *under the current process's memory cgroup* so that it needs no
delegation beyond what the caller already has::

    <mount>/<current>/chaos-infer-<labid>/        lab root (no limit)
    <mount>/<current>/chaos-infer-<labid>/ctl     supervisord, HAProxy, recorder (no limit)
    <mount>/<current>/chaos-infer-<labid>/r0      one replica (memory limit), restarts rejoin it

Everything here is plain file I/O on cgroupfs; nothing is cached, so a :class:`MemoryCgroup`
can be rebuilt from its path in another process (``lab.json`` stores the paths).
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CgroupError",
    "CgroupHierarchy",
    "CgroupMount",
    "MemoryCgroup",
    "detect_hierarchy",
    "join",
    "kill_tree",
    "read_mounts",
    "read_self_cgroups",
    "remove_tree",
    "rmdir_when_drained",
]

UNLIMITED_V1 = 9223372036854771712  # PAGE_COUNTER_MAX as shown by v1 memory.limit_in_bytes


class CgroupError(Exception):
    """Raised when no usable memory cgroup hierarchy exists or an operation fails."""


@dataclass(frozen=True)
class CgroupHierarchy:
    """Where lab cgroups can be created.

    Attributes:
        version: 1 (v1 ``memory`` controller) or 2 (unified hierarchy with ``memory``).
        base: directory of the current process's memory cgroup; lab roots go below it.
    """

    version: int
    base: Path


@dataclass(frozen=True)
class CgroupMount:
    """One cgroup file system mount, from a ``mountinfo`` line (proc(5))."""

    root: str  # root of the mount inside the hierarchy (mountinfo field 4)
    point: Path  # mount point
    fstype: str  # "cgroup" | "cgroup2"
    options: frozenset[str]  # super options (v1 controllers)


def read_mounts(mountinfo: Path) -> list[CgroupMount]:
    """The ``cgroup`` and ``cgroup2`` mounts listed in ``mountinfo`` (``/proc/<pid>/mountinfo``).

    Raises:
        OSError: ``mountinfo`` cannot be read.
    """
    mounts: list[CgroupMount] = []
    for line in mountinfo.read_text().splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        rfields = right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        fstype = rfields[0]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        point = fields[4].replace("\\040", " ")
        mounts.append(
            CgroupMount(
                root=fields[3],
                point=Path(point),
                fstype=fstype,
                options=frozenset(rfields[2].split(",")),
            )
        )
    return mounts


def read_self_cgroups(proc_cgroup: Path) -> tuple[dict[str, str], str | None]:
    """Return ({v1 controller: path}, v2 path or None) from ``/proc/<pid>/cgroup``.

    Raises:
        OSError: ``proc_cgroup`` cannot be read.
    """
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in proc_cgroup.read_text().splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
            continue
        for ctl in controllers.split(","):
            if ctl:
                v1[ctl] = path
    return v1, v2


def join(mount: CgroupMount, path: str) -> Path:
    """Map a cgroup path from /proc/self/cgroup onto a mount (handles container mount roots)."""
    rel = path
    if mount.root not in ("/", "") and (rel == mount.root or rel.startswith(mount.root + "/")):
        rel = rel[len(mount.root) :]
    return mount.point / rel.lstrip("/")


def detect_hierarchy(
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    mountinfo: Path = Path("/proc/self/mountinfo"),
) -> CgroupHierarchy:
    """Find a memory cgroup hierarchy where this process can create limited children.

    Prefers cgroup v1's ``memory`` controller, then cgroup v2 when ``memory`` is listed in the
    current cgroup's ``cgroup.controllers``.

    Raises:
        CgroupError: neither hierarchy offers a writable memory controller.
    """
    try:
        v1, v2 = read_self_cgroups(proc_cgroup)
        mounts = read_mounts(mountinfo)
    except OSError as exc:
        raise CgroupError(f"cannot read cgroup information: {exc}") from exc
    reasons: list[str] = []
    if "memory" in v1:
        for m in mounts:
            if m.fstype == "cgroup" and "memory" in m.options:
                base = join(m, v1["memory"])
                if (base / "memory.limit_in_bytes").exists() and os.access(base, os.W_OK):
                    return CgroupHierarchy(version=1, base=base)
                reasons.append(f"v1 memory cgroup {base} is not writable")
                break
        else:
            reasons.append("v1 memory controller listed but not mounted")
    else:
        reasons.append("no v1 memory controller")
    if v2 is not None:
        for m in mounts:
            if m.fstype == "cgroup2":
                base = join(m, v2)
                try:
                    controllers = (base / "cgroup.controllers").read_text().split()
                except OSError:
                    controllers = []
                if "memory" in controllers and os.access(base, os.W_OK):
                    return CgroupHierarchy(version=2, base=base)
                reasons.append(
                    f"cgroup v2 at {base} has no memory controller (has: {' '.join(controllers) or 'none'})"
                )
                break
    else:
        reasons.append("no cgroup v2 hierarchy")
    raise CgroupError("no usable memory cgroup: " + "; ".join(reasons))


def _write(path: Path, value: str) -> None:
    try:
        with open(path, "w") as fh:
            fh.write(value)
    except OSError as exc:
        raise CgroupError(f"cannot write {value.strip()!r} to {path}: {exc.strerror}") from exc


@dataclass(frozen=True)
class MemoryCgroup:
    """One memory cgroup directory (v1 or v2); every method reads cgroupfs afresh."""

    path: Path
    version: int

    # -- lifecycle -------------------------------------------------------------------------
    def create(self, limit_bytes: int | None = None) -> MemoryCgroup:
        """Create the directory (parents included) and set the memory limit if given."""
        if self.version == 2:
            self._enable_memory_v2(self.path.parent)
        try:
            self.path.mkdir(parents=False, exist_ok=True)
        except FileNotFoundError:
            MemoryCgroup(self.path.parent, self.version).create()
            self.path.mkdir(exist_ok=True)
        except OSError as exc:
            raise CgroupError(f"cannot create cgroup {self.path}: {exc.strerror}") from exc
        if limit_bytes is not None:
            self.set_limit(limit_bytes)
        return self

    @staticmethod
    def _enable_memory_v2(parent: Path) -> None:
        ctl = parent / "cgroup.subtree_control"
        try:
            if "memory" in ctl.read_text().split():
                return
        except OSError as exc:
            raise CgroupError(f"cannot read {ctl}: {exc.strerror}") from exc
        try:
            _write(ctl, "+memory")
        except CgroupError as exc:
            raise CgroupError(
                f"cgroup v2: cannot enable the memory controller in {parent} ({exc}); "
                "run the lab inside a delegated cgroup without processes of its own"
            ) from exc

    def set_limit(self, limit_bytes: int) -> None:
        """Set the hard memory limit (v1 memory.limit_in_bytes, v2 memory.max)."""
        if self.version == 1:
            _write(self.path / "memory.limit_in_bytes", str(int(limit_bytes)))
        else:
            _write(self.path / "memory.max", str(int(limit_bytes)))
            # Keep swap out of the picture so the limit really triggers the OOM killer.
            swap = self.path / "memory.swap.max"
            if swap.exists():
                _write(swap, "0")

    def exists(self) -> bool:
        """True when the directory is present."""
        return self.path.is_dir()

    # -- membership ------------------------------------------------------------------------
    def add_pid(self, pid: int) -> None:
        """Move a process into this cgroup."""
        _write(self.path / "cgroup.procs", f"{pid}\n")

    def pids(self) -> list[int]:
        """Processes in this cgroup (not its children); empty if the cgroup is gone."""
        try:
            text = (self.path / "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(x) for x in text.split()]

    # -- counters --------------------------------------------------------------------------
    def oom_kills(self) -> int:
        """Kernel OOM kills in this cgroup (v1 memory.oom_control, v2 memory.events)."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            text = (self.path / name).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def usage_bytes(self) -> int:
        """Current memory usage charged to the cgroup (includes page cache)."""
        name = "memory.usage_in_bytes" if self.version == 1 else "memory.current"
        try:
            return int((self.path / name).read_text().strip())
        except (OSError, ValueError):
            return 0

    def limit_bytes(self) -> int | None:
        """The hard memory limit, None if unlimited or unreadable."""
        name = "memory.limit_in_bytes" if self.version == 1 else "memory.max"
        try:
            raw = (self.path / name).read_text().strip()
        except OSError:
            return None
        if raw == "max":
            return None
        value = int(raw)
        return None if value >= UNLIMITED_V1 else value

    def to_json(self) -> dict[str, object]:
        """JSON-able description (for lab.json)."""
        return {"path": str(self.path), "version": self.version}


def _tree(root: Path) -> list[Path]:
    """All cgroup directories under root (deepest first), root last."""
    if not root.is_dir():
        return []
    dirs = [Path(d) for d, _sub, _files in os.walk(root)]
    dirs.sort(key=lambda p: len(p.parts), reverse=True)
    return dirs


def kill_tree(root: Path, version: int, timeout_s: float = 5.0) -> list[int]:
    """SIGKILL every process in the cgroup tree at ``root`` until it is empty.

    Returns the pids that were signalled. Only processes inside the lab's own cgroups are touched.
    """
    killed: list[int] = []
    deadline = time.monotonic() + timeout_s
    while True:
        pids = [p for d in _tree(root) for p in MemoryCgroup(d, version).pids()]
        if not pids:
            return killed
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                if pid not in killed:
                    killed.append(pid)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise CgroupError(f"processes {pids} in {root} survive SIGKILL")
        time.sleep(0.02)


def remove_tree(root: Path, timeout_s: float = 5.0) -> None:
    """rmdir the cgroup tree at ``root`` (children first); retries while the kernel drains it."""
    deadline = time.monotonic() + timeout_s
    for d in _tree(root):
        try:
            rmdir_when_drained(d, deadline, 0.02)
        except OSError as exc:
            raise CgroupError(f"cannot remove cgroup {d}: {exc.strerror}") from exc


def rmdir_when_drained(path: Path, deadline: float, pause_s: float) -> None:
    """rmdir the (cgroup) directory ``path``, retrying every ``pause_s`` seconds while the kernel
    answers EBUSY (its last tasks are still leaving) until ``deadline`` (``time.monotonic()``).

    A directory that is already gone counts as removed.

    Raises:
        OSError: any other error, or still EBUSY after ``deadline``.
    """
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(pause_s)
