"""Probes for the network-jitter drill: duplicate generations caused by client retries.

A logical request whose attempt timed out at the client may still be generating on the engine
when the retry starts; the engine then generates it twice (duplicate generation, duplicate
billing). The lab's engine ledger (``<lab>/ledger.jsonl``, one line per generation started) is
the ground truth; the client's attempt records give the logical request ids of this run.
"""

from __future__ import annotations

from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer import settings
from chaoslib_infer.drills.criterion import configured_overrides
from chaoslib_infer.load.records import read_records
from chaoslib_infer.measure.figkit import read_jsonl
from chaoslib_infer.measure.rerun import rerun_figures

__all__ = ["duplicates_check"]


def duplicates_check(
    max_duplicates: float = 0, configuration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Check the run's duplicate generations against a budget.

    Counts the logical requests of this run's background load (every attempt record since the
    load started) that the engine generated more than once, from the lab's generation ledger
    (definition: ``docs/definitions.md``, "Drill figures"), a re-run of a generation a fault
    aborted left out (``docs/definitions.md``, "Re-runs and duplicates"): the slowed replica
    goes on generating, so every second generation here is the client's duplicate. The count
    is the verdict's own ``duplicate_generations``
    (:func:`chaoslib_infer.measure.rerun.rerun_figures`), never a second computation of it.

    When the ledger holds no generation line of this run's requests the count is unmeasured,
    never 0: the probe then fails closed under a budget (``passed`` False, ``result``
    ``"unmeasured"``, ``judged`` False: the verdict's own ``duplicate_generations`` row, unmeasured
    too, makes the drill inconclusive; no hypothesis line fails it on a figure nobody measured).

    Args:
        max_duplicates: the budget (logical requests generated more than once); a negative value
            means no budget: the count is reported and the check passes.
        configuration: Chaos Toolkit configuration (``infer_run_dir`` for the records,
            ``infer_lab_dir`` for the ledger; ``infer_criteria``: a ``duplicate_generations``
            override there, from the plan or ``--criterion``, replaces ``max_duplicates``,
            ``off`` meaning no budget).

    Returns:
        ``{"metric": "duplicate_generations", "value" (count; None: unmeasured), "op": "<=",
        "threshold" (None without a budget), "passed", "result" (``pass``, ``fail``,
        ``not judged``, ``unmeasured``), "requests" (logical requests), "attempts",
        "retries"}``, and ``"judged": False`` with ``"reasons"`` when unmeasured; use the
        tolerance ``{"type": "jsonpath", "path": "$.passed", "expect": true}``.

    Raises:
        ActivityFailed: ``max_duplicates`` or the override is not a number, or the lab has no ledger file (no lab,
            or an engine without one: duplicates cannot be counted there).
    """
    try:
        budget = float(max_duplicates)
    except (TypeError, ValueError):
        raise ActivityFailed(f"max_duplicates must be a number, got {max_duplicates!r}") from None
    try:  # the operator's criterion (plan, --criterion) wins over the experiment's budget
        override = configured_overrides(configuration, "network-jitter")
    except ValueError as exc:
        raise ActivityFailed(str(exc)) from None
    if "duplicate_generations" in override:
        value = override["duplicate_generations"]
        budget = -1.0 if value is None else value
    ledger_path = settings.lab_dir(configuration) / "ledger.jsonl"
    if not ledger_path.exists():
        raise ActivityFailed(
            f"no engine generation ledger at {ledger_path}: duplicates need the lab's sim engine"
        )
    path = settings.records_path(configuration)
    records = read_records(path) if path.exists() else []
    ids = {r.get("request_id") for r in records}
    ids.discard(None)
    # a generation the fault aborted (a replica it took; none in this drill: the slowed replica
    # goes on generating) is re-run by the fault's doing, not duplicated (measure/rerun.py)
    faults = read_jsonl(settings.faults_path(configuration))
    events = read_jsonl(settings.lab_dir(configuration) / "events.jsonl")
    count = rerun_figures(records, read_jsonl(ledger_path), faults, events)["duplicate_generations"]
    threshold = None if budget < 0 else budget
    out: dict[str, Any] = {
        "metric": "duplicate_generations",
        "value": count,
        "op": "<=",
        "threshold": threshold,
        "passed": threshold is None or (count is not None and count <= threshold),
        "result": _result(count, threshold),
        "requests": len(ids),
        "attempts": len(records),
        "retries": sum(1 for r in records if int(r.get("attempt") or 1) > 1),
    }
    if count is None:
        out["judged"] = False
        out["reasons"] = [
            f"duplicate generations unmeasured: the engine ledger holds no generation line of "
            f"this run's {len(ids)} requests (duplicate_generations)"
        ]
    return out


def _result(count: int | None, threshold: float | None) -> str:
    if count is None:
        return "unmeasured"
    if threshold is None:
        return "not judged"
    return "pass" if count <= threshold else "fail"
