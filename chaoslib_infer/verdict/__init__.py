"""Verdicts that can fail: each drill's criteria, its fault timeline, and the judge.

Public surface: :class:`Criterion`, :func:`criteria_for`, :func:`parse_override`,
:class:`DrillFacts`, :class:`Verdict`, :func:`judge_drill`, :func:`exit_code`,
:func:`figure_error_reason`, :data:`STATES`.
Definitions: ``docs/definitions.md`` ("Drill criteria", "Windows", "Verdicts").
"""

from .criteria import (
    COMMON,
    DRILL_CRITERIA,
    MIN_REQUESTS,
    Criterion,
    criteria_for,
    overrides_for,
    parse_override,
)
from .judge import (
    STATES,
    DrillFacts,
    Verdict,
    exit_code,
    figure_error_reason,
    format_value,
    judge_drill,
)
from .timeline import Timeline, timeline

__all__ = [
    "COMMON",
    "DRILL_CRITERIA",
    "MIN_REQUESTS",
    "STATES",
    "Criterion",
    "DrillFacts",
    "Timeline",
    "Verdict",
    "criteria_for",
    "exit_code",
    "figure_error_reason",
    "format_value",
    "judge_drill",
    "overrides_for",
    "parse_override",
    "timeline",
]
