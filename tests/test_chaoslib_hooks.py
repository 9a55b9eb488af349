"""The chaoslib internals the game day replaces (chaoslib_infer/chaoslib_hooks.py) are still there
and still used: these fail on a chaostoolkit-lib that renamed or stopped using them, where the
replacement would silently do nothing (Ctrl-C waiting out a pause; SIGTERM not stopping the run).
"""

from __future__ import annotations

import inspect
import os
import re
import signal
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import chaoslib
import chaoslib.activity
import chaoslib.exit
import chaoslib.experiment
import chaoslib.run
import pytest

from chaoslib_infer import chaoslib_hooks
from chaoslib_infer.chaoslib_hooks import (
    VERIFIED_CHAOSLIB,
    ChaoslibIncompatible,
    PauseSkippingTime,
    check_chaoslib_hooks,
    interrupt_on_sigterm,
    no_pause_after_interrupt,
)

ROOT = Path(__file__).resolve().parent.parent


def _code(func: object) -> str:
    """The source of ``func``, comments removed."""
    return re.sub(r"#.*", "", inspect.getsource(func))  # type: ignore[arg-type]


def test_the_installed_chaoslib_is_in_the_verified_range_pinned_in_pyproject() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(d for d in deps if d.startswith("chaostoolkit-lib"))
    assert pin.endswith(VERIFIED_CHAOSLIB), pin
    major, minor = (int(x) for x in chaoslib.__version__.split(".")[:2])
    assert (major, minor) == (1, 44), chaoslib.__version__


def test_activity_pauses_sleep_on_the_module_level_time_of_chaoslib_activity() -> None:
    assert chaoslib.activity.time is time
    src = _code(chaoslib.activity.execute_activity)
    # both pauses go through the module attribute that no_pause_after_interrupt replaces
    assert re.search(r"pause_before\s*=\s*pauses\.get\(\"before\"\)", src), src
    assert "time.sleep(pause_before)" in src, src
    assert "time.sleep(pause_after)" in src, src
    # the pause after runs in a finally clause (why an interrupted activity would sit through it)
    finally_part = src.split("finally:", 1)[1]
    assert "time.sleep(pause_after)" in finally_part
    # and no other sleeper (a threading.Event, asyncio) took over the pauses
    assert src.count("sleep(") == 2, src


def test_the_run_path_enters_chaoslib_run_exit_signals() -> None:
    assert callable(chaoslib.run.exit_signals)
    assert "with exit_signals():" in _code(chaoslib.run.Runner.run)
    # the game day's run_experiment is chaoslib.experiment's, which runs Runner.run
    src = _code(chaoslib.experiment.run_experiment)
    assert "Runner(" in src and "runner.run(" in src, src
    # exit_signals installs chaoslib's own SIGTERM handler (what interrupt_on_sigterm keeps out)
    assert "signal.SIGTERM" in _code(chaoslib.run.exit_signals.__wrapped__)


def test_the_run_time_check_passes_on_the_installed_chaoslib() -> None:
    check_chaoslib_hooks()


@pytest.fixture
def restore() -> Iterator[None]:
    saved = (chaoslib.run.exit_signals, chaoslib.run.Runner.run, chaoslib.activity.time)
    try:
        yield
    finally:
        chaoslib.run.exit_signals, chaoslib.run.Runner.run, chaoslib.activity.time = saved


def test_a_renamed_exit_signals_stops_the_run_before_it_starts(
    restore: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(chaoslib.run, "exit_signals")
    before_term = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ChaoslibIncompatible, match=r"chaoslib\.run\.exit_signals is gone"):
        with interrupt_on_sigterm():
            pytest.fail("entered")
    assert signal.getsignal(signal.SIGTERM) is before_term  # nothing was installed


def test_a_run_path_that_no_longer_enters_exit_signals_stops_the_run(
    restore: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(self: object, *args: object, **kwargs: object) -> None:
        return None

    monkeypatch.setattr(chaoslib.run.Runner, "run", run)
    with pytest.raises(ChaoslibIncompatible, match=r"no longer enters exit_signals"):
        with interrupt_on_sigterm():
            pytest.fail("entered")


def test_a_chaoslib_activity_without_time_stops_the_run(
    restore: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(chaoslib.activity, "time")
    with pytest.raises(ChaoslibIncompatible, match=r"chaoslib\.activity\.time is not") as err:
        with no_pause_after_interrupt():
            pytest.fail("entered")
    assert VERIFIED_CHAOSLIB in str(err.value) and chaoslib.__version__ in str(err.value)
    assert "\n" not in str(err.value)


def test_pauses_that_no_longer_sleep_on_time_stop_the_run(
    restore: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def execute_activity(*args: object) -> None:
        return None

    monkeypatch.setattr(chaoslib.activity, "execute_activity", execute_activity)
    with pytest.raises(ChaoslibIncompatible, match=r"no longer pauses with time\.sleep"):
        with no_pause_after_interrupt():
            pytest.fail("entered")


def test_the_replacements_are_installed_for_the_run_and_put_back(restore: None) -> None:
    before_term = signal.getsignal(signal.SIGTERM)
    original = chaoslib.run.exit_signals
    with interrupt_on_sigterm(), no_pause_after_interrupt():
        assert isinstance(chaoslib.activity.time, PauseSkippingTime)
        assert chaoslib.run.exit_signals is not original
        with chaoslib.run.exit_signals():  # installs nothing: our SIGTERM handler stays
            handler = signal.getsignal(signal.SIGTERM)
            assert callable(handler) and handler is not before_term
            with pytest.raises(KeyboardInterrupt):
                handler(signal.SIGTERM, None)  # type: ignore[misc,operator]
    assert chaoslib.activity.time is time
    assert chaoslib.run.exit_signals is original
    assert signal.getsignal(signal.SIGTERM) is before_term


def test_a_pause_is_skipped_only_while_a_keyboard_interrupt_propagates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(chaoslib_hooks.time, "sleep", slept.append)
    clock = PauseSkippingTime()
    clock.sleep(2.0)
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        clock.sleep(3.0)
    with pytest.raises(KeyboardInterrupt):
        try:
            raise KeyboardInterrupt
        finally:
            clock.sleep(4.0)  # chaoslib's pause after: a finally clause
    assert slept == [2.0]
    assert clock.monotonic() > 0  # every other name is time's own


#: The SIGTERM handler the action saw (filled by :func:`wait_for_sigterm`, run by chaoslib).
SEEN: dict[str, object] = {}


def wait_for_sigterm() -> str:
    """A Python action: SIGTERM this process in 0.2 s and wait up to 10 s for it to land."""
    SEEN["handler"] = signal.getsignal(signal.SIGTERM)
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        time.sleep(0.02)
    return "no signal"


def clock() -> float:
    """A Python rollback: when it ran (unix s)."""
    return time.time()


def test_sigterm_in_a_real_chaoslib_run_stops_it_and_skips_the_pause(restore: None) -> None:
    """chaoslib's own run loop, under both replacements: SIGTERM during an action with a 20 s
    ``pauses.after`` is a Ctrl-C (the run is ``interrupted``), the pause is skipped and the
    rollbacks play at once."""
    experiment = {
        "title": "sigterm",
        "description": "SIGTERM during an action with a long pause after it",
        "method": [
            {
                "type": "action",
                "name": "wait-for-sigterm",
                "provider": {"type": "python", "module": __name__, "func": "wait_for_sigterm"},
                "pauses": {"after": 20},
            }
        ],
        "rollbacks": [
            {
                "type": "action",
                "name": "clock",
                "provider": {"type": "python", "module": __name__, "func": "clock"},
            }
        ],
    }
    before_term = signal.getsignal(signal.SIGTERM)
    t0 = time.time()
    with interrupt_on_sigterm(), no_pause_after_interrupt():
        journal = chaoslib.experiment.run_experiment(
            experiment, settings={"runtime": {"rollbacks": {"strategy": "always"}}}
        )
    took = time.time() - t0
    assert journal["status"] == "interrupted", journal["status"]
    assert [r["activity"]["name"] for r in journal["rollbacks"]] == ["clock"]
    started = float(journal["rollbacks"][0]["output"])
    assert started - t0 < 5.0 and took < 8.0, (started - t0, took)  # not after the 20 s pause
    handler = SEEN["handler"]
    assert callable(handler) and handler is not chaoslib.exit._terminate_now  # ours, not chaoslib's
    assert signal.getsignal(signal.SIGTERM) is before_term


def test_a_game_day_on_an_unfit_chaoslib_starts_nothing(
    restore: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from chaoslib_infer.gameday import default_plan_path, run_gameday
    from chaoslib_infer.plan import load_plan

    monkeypatch.delattr(chaoslib.run, "exit_signals")
    out = tmp_path / "gd"
    with pytest.raises(ChaoslibIncompatible, match="chaostoolkit-lib"):
        run_gameday(load_plan(default_plan_path()), out, progress=lambda _msg: None)
    assert not (out / "summary.json").exists() and not (out / "lab").exists()
