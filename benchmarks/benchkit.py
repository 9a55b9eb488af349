"""What the benchmark scripts share: their error, a pinned engine's port, stopping a process,
the core checks and the work folder.

Imported by ``client_ceiling.py`` and ``soak_memory.py`` as a sibling (each puts this folder on
``sys.path`` first, so that it is found when the script runs and when a test loads it by path).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["BenchError", "check_cores", "engine_port", "stop", "work_dir"]

_LISTEN = re.compile(r"lab-engine listening .* port=(\d+)")


class BenchError(Exception):
    """The benchmark cannot go on (bad input, engine or our client failed)."""


def engine_port(proc: subprocess.Popen[str], deadline: float) -> int:
    """The port a lab engine started with ``--port 0`` listens on, read from its stderr
    (``lab-engine listening ... port=N``) until ``deadline`` (``time.monotonic()``, seconds).

    Raises:
        BenchError: no such line before the deadline or the end of its stderr.
    """
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        m = _LISTEN.search(line)
        if m:
            return int(m.group(1))
    raise BenchError(f"the sim engine did not start (exit {proc.poll()})")


def stop(proc: subprocess.Popen[Any], group: bool = False) -> None:
    """SIGTERM (the process group with ``group``), wait 5 s, then SIGKILL (waits 5 s more)."""
    if proc.poll() is not None:
        return

    def sig(s: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(proc.pid, s)
            else:
                proc.send_signal(s)

    sig(signal.SIGTERM)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        sig(signal.SIGKILL)
        proc.wait(5)


def check_cores(p: argparse.ArgumentParser, a: argparse.Namespace, names: tuple[str, ...]) -> None:
    """``p.error`` (exit 2) when an option of ``names`` (``client_core`` ...) is a CPU this
    process may not run on (``os.sched_getaffinity``)."""
    cores = os.sched_getaffinity(0)
    for name in names:
        if getattr(a, name) not in cores:
            p.error(f"--{name.replace('_', '-')} {getattr(a, name)} is not an allowed core "
                    f"(allowed: {sorted(cores)})")  # fmt: skip


@contextlib.contextmanager
def work_dir(out: Path | None, prefix: str) -> Iterator[Path]:
    """``out`` (created), or a temporary folder named ``<prefix>...`` removed on exit."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        yield out
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)
