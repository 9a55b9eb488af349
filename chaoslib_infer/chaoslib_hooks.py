"""The two chaoslib internals the game day replaces for the length of a drill, checked first.

Chaos Toolkit has no public hook for either behaviour the game day needs, so
:func:`chaoslib_infer.drill_run.run_drill` swaps two module attributes of chaoslib while
``run_experiment`` runs, and puts them back after:

- ``chaoslib.run.exit_signals`` (the context manager ``Runner.run`` enters, which installs
  chaoslib's SIGTERM / SIGUSR1 / SIGUSR2 handlers): replaced by one that installs nothing, so the
  game day's own SIGTERM handler (SIGTERM = Ctrl-C: stop, play the rollbacks, take the lab down)
  stays in force (:func:`interrupt_on_sigterm`);
- ``chaoslib.activity.time`` (the ``time`` module ``execute_activity`` calls ``sleep`` on for an
  activity's ``pauses``): replaced by :class:`PauseSkippingTime`, which skips a pause asked for
  while a ``KeyboardInterrupt`` propagates (:func:`no_pause_after_interrupt`).

Both were verified with chaostoolkit-lib 1.44 (:data:`VERIFIED_CHAOSLIB`, the range
``pyproject.toml`` pins). A chaoslib that no longer has or uses these attributes would make the
swap a silent no-op (Ctrl-C would wait out a 20 s pause; SIGTERM would only fail the current
activity), so :func:`check_chaoslib_hooks` refuses to start a run instead, and
``tests/test_chaoslib_hooks.py`` fails on such a chaoslib.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import chaoslib.activity
import chaoslib.run

from chaoslib_infer.errors import InferChaosError

__all__ = [
    "VERIFIED_CHAOSLIB",
    "ChaoslibIncompatible",
    "PauseSkippingTime",
    "check_chaoslib_hooks",
    "interrupt_on_sigterm",
    "no_pause_after_interrupt",
]

#: The chaostoolkit-lib versions the two replacements were verified with (``pyproject.toml``).
VERIFIED_CHAOSLIB = ">=1.44,<1.45"


class ChaoslibIncompatible(InferChaosError):
    """The installed chaoslib no longer has or uses an attribute the game day replaces."""


def _uses(func: Any, *names: str) -> bool:
    """True when ``func``'s own code names every one of ``names`` (globals or attributes)."""
    code = getattr(func, "__code__", None)
    return code is not None and all(n in code.co_names for n in names)


def check_chaoslib_hooks() -> None:
    """Check that chaoslib still has, and still uses, the two attributes the game day replaces.

    Checked: ``chaoslib.run.exit_signals`` is a callable that ``chaoslib.run.Runner.run`` names;
    ``chaoslib.activity.time`` is the ``time`` module (or our replacement) and
    ``chaoslib.activity.execute_activity`` names ``time`` and ``sleep``.

    Raises:
        ChaoslibIncompatible: one of them is missing or unused (the message names it, and the
            versions this was verified with, :data:`VERIFIED_CHAOSLIB`).
    """
    problems: list[str] = []
    runner = getattr(getattr(chaoslib.run, "Runner", None), "run", None)
    if not callable(getattr(chaoslib.run, "exit_signals", None)):
        problems.append("chaoslib.run.exit_signals is gone")
    elif not _uses(runner, "exit_signals"):
        problems.append("chaoslib.run.Runner.run no longer enters exit_signals()")
    clock = getattr(chaoslib.activity, "time", None)
    if not (clock is time or isinstance(clock, PauseSkippingTime)):
        problems.append("chaoslib.activity.time is not the time module")
    elif not _uses(getattr(chaoslib.activity, "execute_activity", None), "time", "sleep"):
        problems.append("chaoslib.activity.execute_activity no longer pauses with time.sleep")
    if problems:
        version = getattr(chaoslib, "__version__", "?")
        raise ChaoslibIncompatible(
            f"chaostoolkit-lib {version} is not supported (verified: chaostoolkit-lib"
            f"{VERIFIED_CHAOSLIB}): {'; '.join(problems)}; the game day's Ctrl-C / SIGTERM "
            "handling depends on them"
        )


@contextlib.contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """Make SIGTERM behave like Ctrl-C (KeyboardInterrupt) for the whole run, rollbacks included.

    Chaos Toolkit's own SIGTERM handler only fails the current activity and lets the experiment go
    on; a game day that is told to stop must stop, play its rollbacks and take the lab down. The
    previous SIGTERM handler and ``chaoslib.run.exit_signals`` are put back on exit.

    Raises:
        ChaoslibIncompatible: from :func:`check_chaoslib_hooks`, before anything is replaced.
    """
    check_chaoslib_hooks()

    def _handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    @contextlib.contextmanager
    def _same_signals() -> Iterator[None]:
        yield

    previous = signal.signal(signal.SIGTERM, _handler)
    original = chaoslib.run.exit_signals
    chaoslib.run.exit_signals = _same_signals
    try:
        yield
    finally:
        chaoslib.run.exit_signals = original
        signal.signal(signal.SIGTERM, previous)


class PauseSkippingTime:
    """The ``time`` module as Chaos Toolkit's activity runner sees it, minus the pauses that an
    interruption would otherwise sit through.

    chaoslib 1.44 sleeps an activity's ``pauses.after`` in a ``finally`` clause, also when Ctrl-C
    (or SIGTERM, or a stop condition) cut the activity off: the interruption then waited up to
    the whole pause (20 s in network-jitter) before the rollbacks removed the fault. A pause asked
    for while a ``KeyboardInterrupt`` propagates is skipped; every other call is ``time``'s own.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        """``time.sleep(seconds)``, or nothing while a ``KeyboardInterrupt`` propagates."""
        if isinstance(sys.exc_info()[1], KeyboardInterrupt):
            return
        time.sleep(seconds)


@contextlib.contextmanager
def no_pause_after_interrupt() -> Iterator[None]:
    """Install :class:`PauseSkippingTime` in ``chaoslib.activity`` for the length of a run.

    Raises:
        ChaoslibIncompatible: from :func:`check_chaoslib_hooks`, before anything is replaced.
    """
    check_chaoslib_hooks()
    original: types.ModuleType | PauseSkippingTime = chaoslib.activity.time
    chaoslib.activity.time = PauseSkippingTime()
    try:
        yield
    finally:
        chaoslib.activity.time = original
