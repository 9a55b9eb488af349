"""Exceptions shared across chaoslib-infer.

Every expected failure is raised as a subclass of :class:`InferChaosError` with a one-line message;
the CLI prints that line and exits 2 (bad input, unreachable target) without a traceback.
"""

from __future__ import annotations


class InferChaosError(Exception):
    """Base class of every expected, user-facing error (one-line message)."""


class ConfigError(InferChaosError):
    """A plan, experiment, target file or argument is malformed. Message names the file and field."""


class TargetUnreachable(InferChaosError):
    """The system under test cannot be reached (lab not up, URL refusing connections)."""
