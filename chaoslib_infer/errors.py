"""Exceptions shared across chaoslib-infer.

Every expected failure is raised as a subclass of :class:`InferChaosError` with a one-line message;
the CLI prints that line and exits 2 (bad input, unreachable target) without a traceback.
:class:`ServiceFinding` is the one exception that is not an error: a drill's finding about the
service, raised from inside a Chaos Toolkit activity.
"""

from __future__ import annotations

from chaoslib.exceptions import ActivityFailed


class InferChaosError(Exception):
    """Base class of every expected, user-facing error (one-line message)."""


class ConfigError(InferChaosError):
    """A plan, experiment, target file or argument is malformed. Message names the file and field."""


class TargetUnreachable(InferChaosError):
    """The system under test cannot be reached (lab not up, URL refusing connections)."""


class ServiceFinding(ActivityFailed):
    """A method probe measured the weakness its drill exists to find, not a tool failure.

    Raised by the recovery waits of the drills (a lost replica that never served again within its
    deadline, an OOM-killed replica that never came back): Chaos Toolkit records it as a failed
    probe, :func:`chaoslib_infer.evidence.journal.method_findings` reads it back, and the verdict
    is ``failed`` with the message as its reason (not ``error``, which says the tool could not run
    the drill). The message must name what was measured and the deadline it missed.
    """
