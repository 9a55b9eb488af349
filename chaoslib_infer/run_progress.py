"""Progress and journal plumbing of a game day: the console line sink, timestamps, the Chaos
Toolkit event handler that prints a drill's phases and saves its journal as it grows.

Split out of :mod:`chaoslib_infer.gameday` (issue 12); shared by the drill run
(:mod:`chaoslib_infer.drill_run`), its evidence (:mod:`chaoslib_infer.gameday_evidence`), the
report (:mod:`chaoslib_infer.report`) and the game day.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaoslib.run import RunEventHandler

from chaoslib_infer.evidence.render import write_atomic
from chaoslib_infer.safety import redact

__all__ = ["Progress", "ProgressHandler", "iso", "redacting_progress"]

Progress = Callable[[str], None]


def iso(t: float | None = None) -> str:
    """``t`` (unix seconds; default now) as ISO 8601 text in UTC."""
    return dt.datetime.fromtimestamp(t if t is not None else time.time(), dt.UTC).isoformat()


class ProgressHandler(RunEventHandler):  # type: ignore[misc]
    """Print the phases of a Chaos Toolkit run as they happen; save the journal as it grows.

    With ``journal_path``, the journal so far (status ``running`` until the run ends, secrets
    scrubbed) is written atomically when the run starts and after each steady-state hypothesis,
    so a runner killed mid-drill leaves the phases it completed on disk.
    """

    def __init__(
        self,
        drill: str,
        progress: Progress,
        journal_path: Path | None = None,
        secrets: list[str] | None = None,
    ) -> None:
        self.drill = drill
        self.progress = progress
        self.t0 = time.monotonic()
        self.journal_path = journal_path
        self.secrets = list(secrets or [])

    def _say(self, msg: str) -> None:
        self.progress(f"  [{self.drill} +{time.monotonic() - self.t0:5.1f}s] {msg}")

    def _save(self, journal: Any) -> None:
        if self.journal_path is None or not isinstance(journal, dict):
            return
        with contextlib.suppress(Exception):  # progress must never break the run
            partial = {**journal, "status": journal.get("status") or "running"}
            text = json.dumps(partial, indent=2, default=str)
            write_atomic(self.journal_path, redact.redact_text(text, self.secrets))

    def started(self, experiment: Any, journal: Any) -> None:
        self._save(journal)

    def interrupted(self, experiment: Any, journal: Any) -> None:
        self._save(journal)

    def start_hypothesis_before(self, experiment: dict[str, Any]) -> None:
        self._say("steady-state hypothesis (before the fault)...")

    def hypothesis_before_completed(self, experiment: Any, state: Any, journal: Any) -> None:
        self._hypothesis("before", state, journal)

    def start_method(self, experiment: dict[str, Any]) -> None:
        self._say("method: injecting the fault...")

    def method_completed(self, experiment: Any, state: Any) -> None:
        self._say("method completed")

    def start_hypothesis_after(self, experiment: dict[str, Any]) -> None:
        self._say("steady-state hypothesis (after the fault)...")

    def hypothesis_after_completed(self, experiment: Any, state: Any, journal: Any) -> None:
        self._hypothesis("after", state, journal)

    def _hypothesis(self, when: str, state: Any, journal: Any) -> None:
        """Say whether the steady-state hypothesis held ``when`` (before/after the fault)."""
        met = bool(state and state.get("steady_state_met"))
        self._say(f"hypothesis {when}: {'held' if met else 'DID NOT HOLD'}")
        self._save(journal)

    def start_rollbacks(self, experiment: dict[str, Any]) -> None:
        self._say("rollbacks...")

    def rollbacks_completed(self, experiment: Any, journal: Any) -> None:
        self._say("rollbacks done")
        self._save(journal)  # an interrupt after this point still finds the rollbacks on disk


def redacting_progress(progress: Progress, secrets: list[str]) -> Progress:
    """``progress`` with the secrets scrubbed from every line.

    A console that went away (``chaos-infer gameday | head``, a closed terminal, a killed
    parent: ``BrokenPipeError`` / ``OSError`` on write) must not stop the run between a fault
    and its rollback or before the lab is taken down: progress is then dropped, the evidence
    on disk still records everything.
    """
    gone = False

    def _say(msg: str) -> None:
        nonlocal gone
        if gone:
            return
        try:
            progress(redact.redact_text(msg, secrets))
        except OSError:
            gone = True

    return _say
