"""The verdict policy: how much loss a fault may cost (``docs/definitions.md``, "Verdict policy").

Two policies, chosen per plan (``verdict_policy:``), per drill, per run (``--verdict-policy``) or
in an experiment (configuration key ``infer_verdict_policy``):

- ``strict``: no request may be lost to the fault. The SLO rates are judged as SLOs over the
  fault window and the whole drill (``availability`` and ``availability_fault`` >= 0.999,
  ``timeout_rate``/``timeout_rate_fault`` < 0.5 %, ``error_rate`` < 0.1 %): over a fault window
  of 35-80 requests, or a drill of a few hundred, one lost request breaks them.
- ``default``: the fault is judged by what it costs (its error-budget share, ``budget_share``),
  by its recovery (interruption, restart, replacement, the after window against the baseline)
  and by the drill's own question (hung requests, duplicates, warm-up, ejection, ...), which stay
  as strict as under ``strict``. The rows of :data:`ZERO_LOSS` are shown, not judged: their
  note says "not judged under policy default: ...". The baseline's own SLO check is unchanged
  (a defect before the fault still fails the drill).

Both policies judge ``budget_share``; its inputs are the plan's availability SLO
(``slo_availability``, default 0.999) and the expected incidents per month of the fault
(``incidents_per_month``, default 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_INCIDENTS_PER_MONTH",
    "DEFAULT_POLICY",
    "POLICIES",
    "ZERO_LOSS",
    "VerdictPolicy",
    "apply_policy",
    "configured_policy",
    "make_policy",
    "stored_policy",
]

#: The policies, the default first.
POLICIES = ("default", "strict")
DEFAULT_POLICY = "default"
#: How often a plan expects each fault when it does not say (per month).
DEFAULT_INCIDENTS_PER_MONTH = 1.0

#: The rows the default policy shows without judging, each with why: zero-loss rules presented
#: as SLOs (a window of tens of requests fails on one lost request), whose loss the budget
#: share judges by what it costs instead.
ZERO_LOSS: dict[str, str] = {
    "availability_fault": "the fault is judged by its error-budget cost (budget_share)",
    "timeout_rate_fault": "the fault is judged by its error-budget cost (budget_share)",
    "availability": (
        "the whole drill's failures are the baseline's (judged before the fault) and the "
        "fault's (budget_share, from the injection to the end of the load)"
    ),
    "timeout_rate": (
        "the whole drill's timeouts are the baseline's (judged before the fault) and the "
        "fault's (budget_share)"
    ),
    "error_rate": (
        "the whole drill's failures are the baseline's (judged before the fault) and the "
        "fault's (budget_share)"
    ),
}


@dataclass(frozen=True)
class VerdictPolicy:
    """How a drill's losses are judged (module docstring).

    Attributes:
        name: ``default`` or ``strict``.
        incidents_per_month: how often the plan expects this fault (0 or more).
        slo_availability: the availability SLO whose monthly budget the fault spends (0..1).
    """

    name: str = DEFAULT_POLICY
    incidents_per_month: float = DEFAULT_INCIDENTS_PER_MONTH
    slo_availability: float = 0.999

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``summary.json`` ``verdict_policy``)."""
        return {
            "name": self.name,
            "incidents_per_month": self.incidents_per_month,
            "slo_availability": self.slo_availability,
        }


def _number(what: str, value: Any, low: float, high: float | None, closed: bool) -> float:
    """``value`` as a finite float in ``[low, high)`` (``closed``: ``[low, ...]`` else
    ``(low, ...)``)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}={value!r}: not a number") from None
    ok = math.isfinite(v) and (v >= low if closed else v > low) and (high is None or v < high)
    if not ok or isinstance(value, bool):
        span = f"{'[' if closed else '('}{low:g}, {high:g})" if high else f"{low:g} or more"
        raise ValueError(f"{what}={value!r}: expected a number in {span}")
    return v


def make_policy(
    name: Any = None, incidents_per_month: Any = None, slo_availability: Any = None
) -> VerdictPolicy:
    """A checked :class:`VerdictPolicy`; None for a part keeps its default.

    Raises:
        ValueError: one line: an unknown policy name, a negative or non-numeric
            ``incidents_per_month``, an SLO outside (0, 1).
    """
    pol = VerdictPolicy()
    if name is not None:
        word = str(name).strip().lower()
        if word not in POLICIES:
            raise ValueError(f"verdict_policy={name!r}: expected one of {', '.join(POLICIES)}")
        pol = VerdictPolicy(word, pol.incidents_per_month, pol.slo_availability)
    if incidents_per_month is not None:
        n = _number("incidents_per_month", incidents_per_month, 0.0, None, True)
        pol = VerdictPolicy(pol.name, n, pol.slo_availability)
    if slo_availability is not None:
        slo = _number("slo_availability", slo_availability, 0.0, 1.0, False)
        pol = VerdictPolicy(pol.name, pol.incidents_per_month, slo)
    return pol


def _set(value: Any) -> Any:
    """A configuration value, or None when absent, empty or an unresolved ``${...}``."""
    if value is None or (isinstance(value, str) and (not value.strip() or value.startswith("${"))):
        return None
    return value


def configured_policy(configuration: Mapping[str, Any] | None) -> VerdictPolicy:
    """The policy in a Chaos Toolkit configuration: ``infer_verdict_policy``,
    ``infer_incidents_per_month`` and ``slo_availability`` (the game day sets them from the plan
    and the command line; ``chaos run --var infer_verdict_policy=strict``).

    Raises:
        ValueError: a value :func:`make_policy` refuses.
    """
    cfg = configuration or {}
    return make_policy(
        _set(cfg.get("infer_verdict_policy")),
        _set(cfg.get("infer_incidents_per_month")),
        _set(cfg.get("slo_availability")),
    )


def stored_policy(doc: Any) -> VerdictPolicy:
    """The policy a drill was judged under, from its ``summary.json`` entry
    (``verdict_policy``: :meth:`VerdictPolicy.as_dict`), so ``chaos-infer report`` re-renders it
    the same way. Evidence written before policies existed was judged by the zero-loss rule:
    ``strict``. A malformed entry reads as the defaults of what it lacks.
    """
    if not isinstance(doc, Mapping):
        return VerdictPolicy("strict")
    try:
        return make_policy(
            doc.get("name"), doc.get("incidents_per_month"), doc.get("slo_availability")
        )
    except ValueError:
        return VerdictPolicy("strict")


def apply_policy(rows: Sequence[dict[str, Any]], policy: VerdictPolicy) -> list[dict[str, Any]]:
    """``rows`` (the verdict's judged rows) under ``policy``: under ``default`` each judged
    (pass or fail) row of :data:`ZERO_LOSS` reads ``not judged`` with the note ``"not judged
    under policy default: WHY"``; its value and threshold stay for the reader. Rows are copied,
    never changed in place; under ``strict`` they are returned as they are."""
    if policy.name == "strict":
        return [dict(r) for r in rows]
    out = []
    for r in rows:
        row = dict(r)
        why = ZERO_LOSS.get(str(row.get("criterion")))
        if why is not None and row.get("result") in ("pass", "fail"):
            row["result"] = "not judged"
            row["note"] = f"not judged under policy {policy.name}: {why}"
        out.append(row)
    return out
