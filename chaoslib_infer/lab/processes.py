"""Process helpers of the lab: is a pid alive, wait for it to die, kill it, spot a memory hog.

A leaf module (the fleet, nodes, the registry and the dead-man use it; it imports none of them).
What ``/proc`` says about a process is read through :mod:`chaoslib_infer.lab.procfs`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from chaoslib_infer.lab import procfs
from chaoslib_infer.lab.hog import HOG_MODULE
from chaoslib_infer.safety.redact import child_env

__all__ = [
    "PACKAGE_PARENT",
    "alive",
    "is_hog",
    "kill",
    "lab_child_env",
    "spawn_in_cgroup",
    "wait_dead",
]

#: the directory holding the ``chaoslib_infer`` package (put first on a lab child's PYTHONPATH)
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def alive(pid: int | None) -> bool:
    """True if ``pid`` runs (zombies count as dead; our own zombies are reaped)."""
    if not pid:
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def wait_dead(pid: int, timeout_s: float) -> bool:
    """Poll every 20 ms until ``pid`` is dead; False when it still runs after ``timeout_s`` s."""
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def kill(pid: int) -> None:
    """SIGKILL ``pid`` (gone already: fine) and wait up to 5 s for it to die."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    wait_dead(pid, 5.0)


def is_hog(pid: int) -> bool:
    """True if ``pid`` is a live memory hog (:mod:`chaoslib_infer.lab.hog`, by its command line)."""
    return bool(pid) and alive(pid) and HOG_MODULE in procfs.cmdline(pid)


def lab_child_env() -> dict[str, str]:
    """Environment of a process the lab starts: :func:`~chaoslib_infer.safety.redact.child_env`
    (never the API key) with :data:`PACKAGE_PARENT` first on ``PYTHONPATH``."""
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_PARENT, *filter(None, [env.get("PYTHONPATH")])])
    return env


def spawn_in_cgroup(cgroup: str, cmd: list[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    """Start ``cmd`` as a lab control process inside the cgroup directory ``cgroup``.

    Runs ``python -m chaoslib_infer.lab.cgexec --cgroup <cgroup> -- <cmd>`` in ``cwd``, in a
    new session (no signal of ours reaches it), stdin from /dev/null, stdout and stderr appended
    to ``log``, with :func:`lab_child_env` and ``PYTHONUNBUFFERED=1``. Returns at once; the
    pid is the wrapper's, which becomes ``cmd`` (exit 125: cgroup not joined, 127: no ``cmd``).

    Raises:
        OSError: ``log`` cannot be opened, or the interpreter cannot be started.
    """
    env = lab_child_env()  # lab children never get the API key
    env["PYTHONUNBUFFERED"] = "1"
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "chaoslib_infer.lab.cgexec", "--cgroup", cgroup, "--", *cmd],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
