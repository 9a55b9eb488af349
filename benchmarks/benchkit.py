"""What the benchmark scripts share: their error, a pinned engine's port, stopping a process,
the core checks and the work folder.

Imported by ``client_ceiling.py`` and ``soak_memory.py`` as a sibling (each puts this folder on
``sys.path`` first, so that it is found when the script runs and when a test loads it by path).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from chaoslib_infer.load.ceiling import listening_port

__all__ = ["BenchError", "check_cores", "engine_port", "pinned_engine", "stop", "work_dir"]


class BenchError(Exception):
    """The benchmark cannot go on (bad input, engine or our client failed)."""


def engine_port(proc: subprocess.Popen[str], deadline: float) -> int:
    """The port a lab engine started with ``--port 0`` listens on, read from its stderr
    (``lab-engine listening ... port=N``) until ``deadline`` (``time.monotonic()``, seconds).

    Raises:
        BenchError: no such line before the deadline or the end of its stderr.
    """
    port = listening_port(proc, deadline)
    if port is not None:
        return port
    raise BenchError(f"the sim engine did not start (exit {proc.poll()})")


@contextlib.contextmanager
def pinned_engine(
    core: int, args: list[str], start_s: float = 20.0
) -> Iterator[tuple[subprocess.Popen[str], int, float]]:
    """Run ``python -m chaoslib_infer.lab.engine <args>`` pinned to CPU ``core`` (``taskset``).

    ``args`` must include ``--port 0``. Yields ``(proc, port, deadline)``: the engine's process,
    the port read from its stderr and the ``time.monotonic()`` deadline (``start_s`` seconds after the start)
    for the caller's own readiness wait; the rest of stderr is drained by a daemon thread. The
    engine is stopped with :func:`stop` on exit.

    Raises:
        BenchError: the engine did not say its port before the deadline.
    """
    cmd = ["taskset", "-c", str(core), sys.executable, "-m", "chaoslib_infer.lab.engine", *args]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + start_s
        port = engine_port(proc, deadline)
        # drain stderr so a chatty engine never blocks on a full pipe
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        yield proc, port, deadline
    finally:
        stop(proc)


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
