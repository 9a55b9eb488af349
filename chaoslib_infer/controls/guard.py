"""Chaos Toolkit control: stop conditions that abort a drill when the service collapses.

Declare it in an experiment, after the ``background-load`` control (or let the game day add it
from the plan's ``stop_conditions:``)::

    controls:
      - name: background-load
        provider: {type: python, module: chaoslib_infer.controls.load, arguments: {...}}
      - name: stop-conditions
        provider:
          type: python
          module: chaoslib_infer.controls.guard
          arguments: {availability_floor: 0.5, window_s: 5, for_s: 3, max_burn_rate: 200}

Arguments are the fields of :class:`chaoslib_infer.safety.guard.StopConditions`;
``slo_availability`` defaults to the experiment's ``slo_availability`` configuration key.

From the start of the experiment (after the load warm-up) until its rollbacks begin, a background
thread reads the drill's records (``settings.records_path(configuration)``) every ``interval_s``
and applies the guards. When one trips it:

1. writes ``<infer_run_dir>/stop_condition.json`` (which guard, value, threshold, since, at) and logs
   a warning to the ``chaostoolkit`` logger;
2. interrupts the main thread: a SIGUSR1 aimed at it (``signal.pthread_kill``, so even a
   ``time.sleep`` of a pause is cut short) whose handler, installed by this control for the length
   of the experiment, raises ``KeyboardInterrupt``. Chaos Toolkit turns that into journal status
   ``interrupted`` and plays the rollbacks (experiments use ``rollbacks.strategy: always``). The
   handler only raises inside a steady-state hypothesis or the method (it looks for Chaos
   Toolkit's frames on the stack), never during rollbacks or the end of the run, so a late signal
   cannot cut a rollback short; a signal that lands between two phases is ignored and re-sent
   every 0.2 s until it lands or the guard is disarmed (rollbacks begin). Where the control cannot
   install a handler (not on the main thread) it falls back to ``_thread.interrupt_main()``;
3. after the experiment, adds ``stop_condition`` to the journal (``chaos run`` writes it to
   ``journal.json``; the game day copies it to ``summary.json`` and marks the drill ``aborted``).
"""

from __future__ import annotations

import _thread
import json
import logging
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from chaoslib.exceptions import InterruptExecution

from chaoslib_infer import settings
from chaoslib_infer.errors import ConfigError
from chaoslib_infer.load.client import INFLIGHT_FILE
from chaoslib_infer.measure.inflight import read_inflight
from chaoslib_infer.safety.guard import RecordTail, StopConditions, Tracker, Trip, hung_samples

__all__ = [
    "STOP_CONDITION_FILE",
    "after_experiment_control",
    "before_experiment_control",
    "before_rollback_control",
    "cleanup_control",
    "read_stop_condition",
]

STOP_CONDITION_FILE = "stop_condition.json"
INTERRUPT_SIGNAL = signal.SIGUSR1
logger = logging.getLogger("chaostoolkit")

_ROLLBACK_FUNCS = {"run_rollback", "apply_rollbacks", "run_rollbacks"}
#: Chaos Toolkit phases a stop condition may cut short (the hypotheses and the method)
_INTERRUPTIBLE_FUNCS = {
    "run_gate_hypothesis",
    "run_steady_state_hypothesis",
    "run_hypothesis_during_method",
    "run_deviation_validation_hypothesis",
    "run_method",
}
RETRY_S = 0.2


def _interruptible(frame: FrameType | None) -> bool:
    """True when ``frame`` is inside a hypothesis or the method, and not inside rollbacks."""
    inside = False
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith("chaoslib"):
            name = frame.f_code.co_name
            if name in _ROLLBACK_FUNCS:
                return False
            if name in _INTERRUPTIBLE_FUNCS:
                inside = True
        frame = frame.f_back
    return inside


class _Guard:
    """One running set of stop conditions (one experiment)."""

    def __init__(self, conditions: StopConditions, records: Path, run_dir: Path) -> None:
        self.conditions = conditions
        self.records = records
        self.run_dir = run_dir
        self.lock = threading.Lock()
        self.disarmed = threading.Event()
        self.trip: Trip | None = None
        self.delivered = False
        self.main_ident = threading.main_thread().ident
        self.previous: Any = None
        self.installed = False
        self.thread = threading.Thread(target=self._loop, name="chaos-infer-guard", daemon=True)

    # -- lifecycle (main thread) -------------------------------------------------------------
    def start(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(INTERRUPT_SIGNAL, self._on_signal)
            self.installed = True
        self.thread.start()

    def disarm(self) -> None:
        """Stop checking and interrupting (rollbacks begin, or the experiment ends); keep what
        tripped."""
        self.disarmed.set()
        with self.lock:  # a trip being recorded right now completes first
            pass
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=self.conditions.interval_s + 2.0)

    def close(self) -> None:
        """Disarm and put the previous signal handler back (main thread only)."""
        self.disarm()
        if self.installed and threading.current_thread() is threading.main_thread():
            signal.signal(INTERRUPT_SIGNAL, self.previous)
            self.installed = False

    # -- the checking thread -----------------------------------------------------------------
    def _loop(self) -> None:
        c = self.conditions
        tail = RecordTail(self.records, keep_s=c.window_s + 1.0)
        tracker = Tracker(c)
        inflight_path = self.records.with_name(INFLIGHT_FILE)
        while not self.disarmed.wait(c.interval_s):
            now = time.time()
            try:
                # a request hung past hang_s counts now, not when the client finally gives up
                hung = hung_samples(read_inflight(inflight_path), now, c.hang_s)
                trip = tracker.check([*tail.poll(now), *hung], now)
            except Exception:  # never let a reading problem kill the guard silently
                logger.debug("stop-condition check failed", exc_info=True)
                continue
            if trip is not None:
                self._fire(trip)
                return

    def _fire(self, trip: Trip) -> None:
        """Record the trip, then interrupt the main thread until it takes the interrupt (it is
        only taken inside a hypothesis or the method) or the guard is disarmed."""
        with self.lock:
            if self.disarmed.is_set():
                return
            self.trip = trip
            _write_trip(self.run_dir, trip)
            logger.warning(
                f"stop condition {trip.guard} tripped: {trip.reason()}; aborting the drill"
            )
        if not (self.installed and self.main_ident is not None):
            _thread.interrupt_main()
            return
        while not self.delivered and not self.disarmed.is_set():
            signal.pthread_kill(self.main_ident, INTERRUPT_SIGNAL)
            self.disarmed.wait(RETRY_S)

    # -- the signal handler (main thread) ----------------------------------------------------
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.trip is None:  # not ours: whatever handled this signal before
            if callable(self.previous):
                self.previous(signum, frame)
            return
        if self.delivered or self.disarmed.is_set() or not _interruptible(frame):
            return  # rollbacks or the end of the run: never cut them short (retried if early)
        self.delivered = True
        raise KeyboardInterrupt(f"stop condition {self.trip.guard}: {self.trip.reason()}")


_GUARDS: dict[str, _Guard] = {}


def _write_trip(run_dir: Path, trip: Trip) -> None:
    from chaoslib_infer.evidence.render import write_atomic

    write_atomic(run_dir / STOP_CONDITION_FILE, json.dumps(trip.as_dict(), indent=2))


def read_stop_condition(run_dir: Path) -> dict[str, Any] | None:
    """The stop condition that aborted the drill in ``run_dir`` (``None`` if none tripped)."""
    try:
        data = json.loads((Path(run_dir) / STOP_CONDITION_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def before_experiment_control(
    context: dict[str, Any],
    configuration: dict[str, Any] | None = None,
    **arguments: Any,
) -> None:
    """Chaos Toolkit hook: validate the stop conditions and start watching the records.

    Args:
        context: the experiment.
        configuration: Chaos Toolkit configuration (``infer_run_dir``, ``slo_availability``).
        arguments: fields of :class:`StopConditions`.

    Raises:
        InterruptExecution: malformed stop conditions (a drill never runs without its guard).
    """
    args = dict(arguments)
    slo = (configuration or {}).get("slo_availability")
    if "slo_availability" not in args and slo not in (None, "") and not str(slo).startswith("${"):
        args["slo_availability"] = slo
    try:
        conditions = StopConditions.from_mapping(args, "stop-conditions control")
    except ConfigError as exc:
        raise InterruptExecution(str(exc)) from exc
    run_dir = settings.run_dir(configuration)
    (run_dir / STOP_CONDITION_FILE).unlink(missing_ok=True)
    key = str(run_dir)
    old = _GUARDS.pop(key, None)
    if old is not None:
        old.close()
    guard = _Guard(conditions, settings.records_path(configuration), run_dir)
    _GUARDS[key] = guard
    guard.start()
    logger.info(
        f"stop conditions armed: availability_floor={conditions.availability_floor} "
        f"max_burn_rate={conditions.max_burn_rate} window_s={conditions.window_s:g} "
        f"for_s={conditions.for_s:g}"
    )


def before_rollback_control(
    context: dict[str, Any], configuration: dict[str, Any] | None = None, **arguments: Any
) -> None:
    """Chaos Toolkit hook: rollbacks begin; stop checking (a rollback is never interrupted)."""
    guard = _GUARDS.get(str(settings.run_dir(configuration)))
    if guard is not None:
        guard.disarm()


def after_experiment_control(
    context: dict[str, Any],
    state: Any = None,
    configuration: dict[str, Any] | None = None,
    **arguments: Any,
) -> None:
    """Chaos Toolkit hook: stop the guard; record what tripped in the journal (``state``)."""
    guard = _GUARDS.pop(str(settings.run_dir(configuration)), None)
    if guard is None:
        return
    guard.close()
    if guard.trip is not None and isinstance(state, dict):
        state["stop_condition"] = guard.trip.as_dict()


def cleanup_control() -> None:
    """Chaos Toolkit hook (always called at the end of a run): stop every guard still running."""
    while _GUARDS:
        _, guard = _GUARDS.popitem()
        guard.close()
