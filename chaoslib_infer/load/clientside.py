"""What the load client itself costs and holds, so a verdict can tell a slow client from a slow
service (``docs/definitions.md``, "Send time"):

* its CPU: the process's CPU seconds and the time its event-loop thread waited for a CPU (the
  kernel's run-queue wait, ``/proc/thread-self/schedstat``: a client pinned short of CPU, by a
  cgroup quota or a busy core, waits there), read at the start and the end of a run
  (:func:`cpu_reading`, :func:`client_cpu`);
* the file descriptors an in-flight cap needs (:func:`raise_fd_limit`: each request in flight
  holds a socket);
* the run summary the load process leaves as the last JSON line of its log
  (:func:`read_run_summary`), and the figures of it the evidence and the verdict show
  (:func:`client_figures`: the cap, its fill, the CPU).
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "CLIENT_FIGURES",
    "CpuReading",
    "client_cpu",
    "client_figures",
    "cpu_reading",
    "raise_fd_limit",
    "read_run_summary",
]

#: ``(process CPU s, run-queue wait s of this thread or None)``
CpuReading = tuple[float, float | None]

#: Figures of the load's own run, from its summary (:func:`client_figures`): name -> summary key.
CLIENT_FIGURES: dict[str, str] = {
    "load_cap": "max_concurrency",
    "load_max_in_flight": "max_in_flight",
    "load_cap_fill": "cap_fill",
    "client_cpu_share": "client_cpu_share",
    "client_runq_wait_share": "client_runq_wait_share",
    "load_client": "client",  # who sent it: ours (transport) or the OpenAI SDK (version, policy)
}

_SCHEDSTAT = Path("/proc/thread-self/schedstat")


def cpu_reading() -> CpuReading:
    """The calling process's CPU seconds (user + system, every thread: ``time.process_time``)
    and the calling thread's run-queue wait in seconds (the second field of
    ``/proc/thread-self/schedstat``, nanoseconds; None where the kernel has no schedstats)."""
    try:
        wait: float | None = int(_SCHEDSTAT.read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        wait = None
    return time.process_time(), wait


def client_cpu(start: CpuReading, end: CpuReading, elapsed_s: float) -> dict[str, float | None]:
    """The client's CPU over a run, from two :func:`cpu_reading` (same thread) ``elapsed_s``
    seconds apart.

    Returns:
        ``client_cpu_s`` (CPU seconds used), ``client_cpu_share`` (of one CPU: 1.0 = a whole
        core busy the whole run), ``client_runq_wait_s`` and ``client_runq_wait_share`` (seconds
        the event-loop thread was ready to run and waited for a CPU, and that over the run;
        None without schedstats).
    """
    span = max(float(elapsed_s), 1e-9)
    cpu = max(end[0] - start[0], 0.0)
    wait = None if start[1] is None or end[1] is None else max(end[1] - start[1], 0.0)
    return {
        "client_cpu_s": round(cpu, 3),
        "client_cpu_share": round(cpu / span, 4),
        "client_runq_wait_s": None if wait is None else round(wait, 3),
        "client_runq_wait_share": None if wait is None else round(wait / span, 4),
    }


def raise_fd_limit(needed: int) -> int:
    """Raise this process's soft limit of open files towards ``needed`` (never past the hard
    limit, never lower it): an in-flight cap of a thousand needs a thousand sockets, and a
    refused ``socket()`` must not read as the service's connect failure.

    Returns:
        The soft limit now in force.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (OSError, ValueError):  # a container that forbids it: keep what there is
            pass
    return int(soft)


def read_run_summary(log: Path) -> dict[str, Any] | None:
    """The load process's run summary: the last line of its log that is a JSON object with a
    ``run_id`` (``python -m chaoslib_infer.load`` prints it when the run ends), or None (no log,
    or a load that was killed before it printed one)."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "run_id" in doc:
            return doc
    return None


def client_figures(summary: Mapping[str, Any] | None) -> dict[str, Any]:
    """The figures of :data:`CLIENT_FIGURES` from a run summary (``{}`` without one): the
    in-flight cap (``load_cap``), the most in flight (``load_max_in_flight``), its fill
    (``load_cap_fill`` = most in flight / cap), the client's CPU share and run-queue wait share
    (fractions of the run). A key the summary lacks (an older load) is left out."""
    if not summary:
        return {}
    return {name: summary[key] for name, key in CLIENT_FIGURES.items() if key in summary}
