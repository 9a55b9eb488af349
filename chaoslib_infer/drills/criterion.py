"""The shape of one acceptance criterion, and the pieces several drills' criteria share.

Every room's ``criteria.py`` defines ``QUESTION`` (one sentence), ``CRITERIA`` (its own
:class:`Criterion` list) and ``DROPPED_COMMON`` (the common criteria it does not judge), which
:mod:`chaoslib_infer.drills.registry` reads (``docs/contracts.md``); their thresholds and meaning:
``docs/definitions.md``, "Drill criteria".

Dependency-free on purpose: every room's ``criteria.py`` imports it, and
:mod:`chaoslib_infer.verdict.criteria` (the common criteria, overrides, ``criteria_for``)
assembles the drills' lists from :mod:`chaoslib_infer.drills.registry`. Thresholds come from the
acceptance table of ``docs/definitions.md`` ("Acceptance SLOs", "Drill criteria"); the parsing of
an override (``[DRILL:]NAME=VALUE``) is here too, so a room's own probe can read the operator's
overrides without importing the verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MIN_REQUESTS",
    "ROUTED_TO_DOWN",
    "Criterion",
    "configured_overrides",
    "override_conflict",
    "interruption",
    "overrides_for",
    "parse_override",
    "retry_cost",
    "provider_errors",
    "threshold_value",
]

#: Minimum requests of a judged window (``docs/definitions.md``, "Windows"): the baseline must
#: show a defect of a few percent (50 requests: 2 failures are 4 %), the fault window must hold
#: enough requests to say anything. Here, in the dependency-free module, so the load control can
#: size its warm-up without importing the verdict.
MIN_REQUESTS = {"baseline": 50, "fault": 10}


@dataclass(frozen=True)
class Criterion:
    """One judged figure.

    Attributes:
        name: unique key (the override name, the ``crit_<name>`` configuration key).
        label: what a person reads in a reason or a table row.
        op: ``<=``, ``<``, ``>=`` or ``>``: value ``op`` threshold passes.
        threshold: default threshold (None: not judged).
        unit: ``s``, ``ratio`` (0..1), ``x`` (a factor), ``count``.
        window: ``baseline``, ``fault``, ``after`` or ``drill``.
        key: the drill's question cannot be answered without it: unmeasured makes the drill
            ``inconclusive``.
        fix: what fixes a failure of it, short, where the service's configuration does (the
            failed row's reason names it: ``"...; fix: FIX (name)"``); None: no such fix.
    """

    name: str
    label: str
    op: str
    threshold: float | None
    unit: str
    window: str
    key: bool = False
    fix: str | None = None


#: Judged by the drills that take replicas away: node-loss, simultaneous-restarts (a gateway
#: figure, :data:`chaoslib_infer.verdict.criteria.GATEWAY_ONLY`): tries the gateway sent to a
#: replica more than ``DOWN_GRACE_S`` (2 s) after it went down, when any health check would
#: have seen it (``routed_to_down``, every try to a down replica, stays among the figures).
ROUTED_TO_DOWN = Criterion(
    "routed_to_down_late", "requests the gateway routed to a replica down for over 2 s", "<=",
    0.0, "count", "fault",
)  # fmt: skip


def interruption(key: bool = False) -> list[Criterion]:
    """The interruption criteria a drill that kills or drops replicas shares.

    Args:
        key: the interruption answers the drill's question (unmeasured: inconclusive).

    Returns:
        ``interruption_s`` (<= 10 s, fault window) and ``interruption_sustained`` (>= 1).
    """
    return [
        Criterion("interruption_s", "interruption", "<=", 10.0, "s", "fault", key=key),
        Criterion(
            "interruption_sustained",
            "service sustained after the interruption",
            ">=",
            1.0,
            "count",
            "fault",
        ),
    ]


def retry_cost(key: bool = False) -> list[Criterion]:
    """What retries cost, judged in every drill in which the client or the gateway retried
    (``n/a`` otherwise; :func:`chaoslib_infer.measure.retrycost.retried`), with the
    network-jitter drill's budgets: a retry that re-runs a generation is paid twice
    (``docs/definitions.md``, "Drill criteria").

    Args:
        key: duplicate generations answer the drill's question (network-jitter): unmeasured
            makes it inconclusive.

    Returns:
        ``duplicate_generations`` (<= 0), ``extra_generations`` (<= 0), ``wasted_tokens``
        (<= 0 tokens), ``retries`` (client retries, not judged) and ``retry_amplification``
        (engine generations per client attempt, <= 1.0x), all over the whole drill.
    """
    return [
        Criterion(
            "duplicate_generations", "duplicate generations", "<=", 0.0, "count", "drill", key=key
        ),
        Criterion(
            "extra_generations", "generations paid twice (extra)", "<=", 0.0, "count", "drill"
        ),
        Criterion(
            "wasted_tokens",
            "tokens of generations paid twice (prompt + completion)",
            "<=",
            0.0,
            "tokens",
            "drill",
        ),
        Criterion("retries", "client retries", "<=", None, "count", "drill"),
        Criterion(
            "retry_amplification",
            "upstream generations per client attempt (gateway retries)",
            "<=",
            1.0,
            "x",
            "drill",
        ),
    ]


def provider_errors() -> list[Criterion]:
    """How the client and the gateway treated a provider's error answers (the ``http_error``
    engine fault, ``measure/retryafter.py``: engine ledger), judged in every drill in which the
    engine answered one (``n/a`` otherwise), over the whole drill.

    Returns:
        ``retry_after_honoured`` (retries that waited the answer's ``Retry-After`` / retries
        after one, >= 1.0), ``retried_final`` (final answers, a 400 for a bad request, sent
        again, <= 0), ``load_amplification`` (engine arrivals per logical request, <= 1.1x: a
        retry budget of 10 % of requests, Google SRE book, "Handling Overload") and
        ``gave_up_retryable`` (requests left on a retryable answer; reported, not judged).
    """
    return [
        Criterion(
            "retry_after_honoured", "retries that waited the answer's Retry-After", ">=", 1.0,
            "ratio", "drill",
        ),
        Criterion(
            "retried_final", "final error answers (a bad request) sent again", "<=", 0.0,
            "count", "drill",
        ),
        Criterion(
            "load_amplification", "engine arrivals per logical request (retry storm)", "<=",
            1.1, "x", "drill",
        ),
        Criterion(
            "gave_up_retryable", "requests left on a retryable error answer", "<=", None,
            "count", "drill",
        ),
    ]  # fmt: skip


def parse_override(text: str) -> tuple[str | None, str, float | None]:
    """Parse ``[DRILL:]NAME=VALUE`` (``VALUE`` a number of 0 or more, or ``off``).

    Returns:
        ``(drill or None, name, threshold or None)``.

    Raises:
        ValueError: no ``=``, an empty name, an empty drill before a ``:`` (``:NAME=VALUE``),
            more than one ``:``, or a value that is neither a finite number of 0 or more nor
            ``off`` (:func:`threshold_value`).
    """
    key, sep, value = text.partition("=")
    shape = f"criterion {text!r}: expected [DRILL:]NAME=VALUE"
    if not sep or not key.strip():
        raise ValueError(shape)
    drill, colon, name = (part.strip() for part in key.strip().partition(":"))
    if not colon:
        drill, name = "", drill
    if not name or (colon and not drill):
        what = "an empty criterion name" if not name else "an empty drill name before ':'"
        raise ValueError(f"{shape} ({what})")
    if ":" in name:
        raise ValueError(f"{shape} (one ':' at most)")
    return (drill or None, name, threshold_value(name, value))


def override_conflict(
    seen: dict[tuple[str | None, str], tuple[float | None, str]],
    drill: str | None,
    name: str,
    threshold: float | None,
    given: str,
) -> str | None:
    """Record one override in ``seen`` (``{(drill or None, name): (threshold, value as given)}``)
    and say whether it contradicts an earlier one of the same scope and name.

    Returns:
        None (first time, or the same threshold again), else ``"NAME given twice with different
        values: A and B"`` (``DRILL:NAME`` when scoped).
    """
    key = (drill, name)
    if key in seen and seen[key][0] != threshold:
        label = f"{drill}:{name}" if drill else name
        return f"{label} given twice with different values: {seen[key][1]} and {given}"
    seen.setdefault(key, (threshold, given))
    return None


def overrides_for(text: str, drill: str) -> dict[str, float | None]:
    """The overrides of ``drill`` in ``text`` (``"NAME=VALUE,DRILL:NAME=off,..."``, the
    ``infer_criteria`` configuration key): items without a drill prefix and those prefixed with
    ``drill``; items of other drills are skipped (one shared value serves every drill's probes).

    Returns:
        ``{name: threshold or None}`` (None: "not judged").

    Raises:
        ValueError: an item is malformed (:func:`parse_override`), or one criterion is given
            twice, in the same scope, with different values (:func:`override_conflict`).
    """
    out: dict[str, float | None] = {}
    seen: dict[tuple[str | None, str], tuple[float | None, str]] = {}
    for item in (x.strip() for x in text.split(",")):
        if item:
            prefix, name, value = parse_override(item)
            clash = override_conflict(seen, prefix, name, value, item.partition("=")[2].strip())
            if clash:
                raise ValueError(f"criterion {clash}")
            if prefix is None or prefix == drill:
                out[name] = value
    return out


def configured_overrides(configuration: Mapping[str, Any] | None, drill: str) -> dict[str, Any]:
    """``drill``'s overrides in the Chaos Toolkit configuration key ``infer_criteria`` (the game
    day sets it from the plan and ``--criterion``; ``chaos run --var infer_criteria=...``); {}
    when absent or still an unresolved ``${...}``.

    Raises:
        ValueError: an item is malformed (:func:`overrides_for`).
    """
    text = str((configuration or {}).get("infer_criteria") or "")
    return {} if text.startswith("${") else dict(overrides_for(text, drill))


def threshold_value(name: str, value: Any) -> float | None:
    """A criterion's threshold from ``value``: None for None (YAML ``null``) or ``off`` (not
    judged), else a finite float of 0 or more (every judged figure is a duration, a count, a
    ratio or a factor: a negative threshold would always pass or always fail).

    Raises:
        ValueError: an empty value, ``none``, a negative number, or anything else that is
            neither a finite number nor ``off``.
    """
    if value is None:
        return None
    if isinstance(value, str):
        word = value.strip().lower()
        if word == "off":
            return None
        if not word:
            raise ValueError(f"criterion {name}={value!r}: empty value; give a number, or 'off'")
        if word == "none":
            raise ValueError(
                f"criterion {name}={value!r}: not a number; write 'off' for not judged"
            )
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"criterion {name}={value!r}: not a number (or 'off')") from None
    if not math.isfinite(v):
        raise ValueError(f"criterion {name}={value!r}: not a finite number")
    if v < 0:
        raise ValueError(f"criterion {name}={value!r}: negative; a threshold is 0 or more")
    return v
