"""Hold Ctrl-C and SIGTERM across the few steps between starting a process and recording it.

Some faults start a process inside the target (a memory hog, the freeze's dead-man timer) whose
pid and start time are only known once the exec that starts it returns; the rollback can only
stop what the saved state records. An interruption landing between the exec and the save (the
Kubernetes interruption matrix hit it: a SIGTERM while the freeze's exec was answering) left the
timer, or worse the hog, running after "rollbacks done". :func:`held_interrupts` makes that span
atomic for SIGINT and SIGTERM: a signal arriving inside is delivered right after the block, once
the state is saved, and the rollback then finds everything it has to undo. A second signal inside
the block is not held (the operator insists): it raises ``KeyboardInterrupt`` at once. The span
is bounded by the exec's own timeout (30 s per exec).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["held_interrupts"]

_HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def held_interrupts() -> Iterator[list[int]]:
    """Defer SIGINT/SIGTERM until the block ends, then deliver the first one held.

    Yields:
        The list of signal numbers held so far (for tests).

    Outside the main thread (where handlers cannot be installed) the block runs unprotected.
    """
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    held: list[int] = []

    def _hold(signum: int, frame: Any) -> None:
        held.append(signum)
        if len(held) > 1:  # a second Ctrl-C / SIGTERM: stop now
            raise KeyboardInterrupt(f"signal {signum}")

    previous = {s: signal.signal(s, _hold) for s in _HELD}
    try:
        yield held
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if len(held) == 1:
            signal.raise_signal(held[0])  # the run's own handler now (rollbacks play)
