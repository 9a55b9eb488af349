"""A fault confirmed by the traffic (``docs/definitions.md``, "Verdicts", confirmation; issue 21
item 3).

A fault counts as applied when the measured traffic felt it, not because the action says it ran:
the faulted replica (lab) or pod (Kubernetes) served requests before the injection, then its
requests **failed**, were **slowed**, **moved** to other replicas, or **paused** after it. Which
engine served a request is the record's ``replica`` (the response's ``X-Replica-Id``, set by the
lab's engine or by the user's deployment, or HAProxy's ``X-Lab-Server``), else the lab's own logs
(``DrillFacts.replica_of``: engine ledger, HAProxy request log).

Rules over the attempt records (unix seconds; ``ok`` attempts unless said otherwise):

- *served before*: at least one attempt sent before ``fault_at`` answered by a faulted replica.
  None: the fault missed the traffic (the URL routes elsewhere).
- *failed*: an attempt on the wire in the fault window (sent before its end, not ended before
  ``fault_at``) failed on a faulted replica: its record names it, or the lab's logs do
  (``replica_of``: the first replica the request reached). A failure that names no replica is
  not counted as the faulted one's (it may have failed anywhere), nor one another replica
  answered.
- *slowed*: the faulted replicas' median E2E in the window is at least :data:`SLOWED_FACTOR` x
  and :data:`SLOWED_MIN_S` above their median before.
- *moved*: the faulted replicas' share of the window's answers is at most :data:`MOVED_SHARE` of
  their share before (the gateway sent their traffic elsewhere).
- *paused*: the faulted replicas answered nothing for a stretch of the window longer than
  :data:`PAUSE_MIN_S` and :data:`PAUSE_FACTOR` x their longest gap before (a restart, a freeze).

Records with no engine identity at all leave only the service-level signs: an unidentified
failure in the window or a slowdown of the whole service; none of them reads as missed, with
the reason saying the records name no engine.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .timeline import Timeline

__all__ = [
    "MISSED",
    "Reach",
    "confirm_by_traffic",
    "faulted_names",
    "quota_reach",
    "serving_counts",
    "traffic_reach",
]

#: The reason of a fault the traffic did not feel (the drill reads ``inconclusive``).
MISSED = "the fault did not reach the service's traffic"
#: slowed: window median E2E >= this factor x the median before ...
SLOWED_FACTOR = 1.25
#: ... and at least this many seconds above it (s).
SLOWED_MIN_S = 0.05
#: moved: the faulted replicas' share of answers fell to at most this fraction of the share before.
MOVED_SHARE = 0.5
#: paused: a gap in the faulted replicas' answers longer than this (s) ...
PAUSE_MIN_S = 1.0
#: ... and than this factor x their longest gap before.
PAUSE_FACTOR = 2.0
#: Drills confirmed by their own rule, not by a faulted replica's traffic.
NOT_BY_REPLICA = ("traffic-spike",)
#: Per drill: what a miss most often means, appended to the reason.
HINTS = {
    "k8s_ingress_block_pod": "is the NetworkPolicy enforced by the cluster's CNI?",
}


@dataclass(frozen=True)
class Reach:
    """What the traffic saw of a fault.

    Attributes:
        felt: True (the faulted replicas served before and failed, slowed, moved or paused
            after), False (the traffic did not feel it), None (nothing to judge: no faulted
            replica named, no injection time).
        why: one line: the signs seen, or what was seen instead.
    """

    felt: bool | None
    why: str


def _pod(value: Any) -> str | None:
    """``"pod (container c)"`` -> ``"pod"``."""
    if not isinstance(value, str) or not value:
        return None
    return value.split(" (", 1)[0]


def faulted_names(drill: str, ground: Mapping[str, Any]) -> list[str]:
    """The replicas (lab) or pods (Kubernetes) a drill's fault acted on, from its ground truth.

    Lab: ``replica``, ``lost_replica_names``, ``replicas`` (simultaneous-restarts) and
    ``stopped`` (quota-cut). Kubernetes (``evidence/kinds/k8s_actions.py``): ``k8s_oom_pod``,
    ``k8s_freeze_pod``, ``k8s_ingress_block_pod``, ``k8s_jitter_pod`` (``"pod (container c)"``)
    and the pods of the ``"k8s_recovery_pod NAME"`` rows (drain, taint, node delete, deletes).

    Returns:
        Names, in order, without duplicates; [] for traffic-spike (confirmed by its rate).
    """
    if drill in NOT_BY_REPLICA:
        return []
    names: list[str] = []

    def add(value: Any) -> None:
        if isinstance(value, str) and value and value not in names:
            names.append(value)

    add(ground.get("replica") if drill != "quota-cut" else None)
    for key in ("lost_replica_names", "replicas", "stopped"):
        for n in ground.get(key) or []:
            add(str(n))
    for key in ("k8s_oom_pod", "k8s_freeze_pod", "k8s_ingress_block_pod", "k8s_jitter_pod"):
        add(_pod(ground.get(key)))
    for key in ground:
        if key.startswith("k8s_recovery_pod "):
            add(key[len("k8s_recovery_pod ") :])
    return names


def _identity(r: Mapping[str, Any], replica_of: Mapping[str, str]) -> str | None:
    rep = r.get("replica") or replica_of.get(str(r.get("request_id")))
    return str(rep) if rep else None


def _is(name: str | None, faulted: Sequence[str]) -> bool:
    """``name`` is a faulted replica, or its run-time detour ``<name>-...`` (the jitter shim)."""
    return name is not None and any(name == f or name.startswith(f + "-") for f in faulted)


def _t(r: Mapping[str, Any], key: str) -> float | None:
    v = r.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _e2e(rs: Sequence[Mapping[str, Any]]) -> list[float]:
    out = []
    for r in rs:
        a, b = _t(r, "sent_at"), _t(r, "end_at")
        if a is not None and b is not None:
            out.append(b - a)
    return out


def _longest_gap(ends: list[float], a: float, b: float) -> float:
    points = sorted([a, *[t for t in ends if a <= t <= b], b])
    return max((y - x for x, y in zip(points, points[1:], strict=False)), default=0.0)


def serving_counts(
    records: Sequence[Mapping[str, Any]],
    a: float,
    b: float,
    replica_of: Mapping[str, str] | None = None,
) -> dict[str, int]:
    """``{engine identity: successful attempts}`` sent in ``[a, b)``: which replicas (or pods)
    carried the load in a window and how much (records without an identity left out)."""
    out: dict[str, int] = {}
    for r in records:
        sent = _t(r, "sent_at")
        if not r.get("ok") or sent is None or not a <= sent < b:
            continue
        name = _identity(r, replica_of or {})
        if name is not None:
            out[name] = out.get(name, 0) + 1
    return out


def _counts(c: Mapping[str, int]) -> str:
    top = sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:4]
    more = f" and {len(c) - 4} more" if len(c) > 4 else ""
    return ", ".join(f"{k} {v}" for k, v in top) + more if c else "none identified"


def traffic_reach(
    records: Sequence[Mapping[str, Any]],
    faulted: Sequence[str],
    fault_at: float | None,
    fault_end: float | None,
    replica_of: Mapping[str, str] | None = None,
    change_needed: bool = True,
) -> Reach:
    """Whether the traffic felt a fault on ``faulted`` (rules in the module docstring).

    Args:
        records: attempt records (``sent_at``, ``end_at`` unix s, ``ok``, ``replica``,
            ``request_id``).
        faulted: the replicas or pods the fault acted on (:func:`faulted_names`).
        fault_at: injection (unix s); fault_end: return to service (None: the last record's
            end).
        replica_of: request id -> replica from the lab's logs.
        change_needed: False when the fault's own ground truth measured it on the replica's
            connections (network-jitter: the delay the shim applied to their chunks): then
            *served before* and at least one drill request on the faulted replica sent during
            the fault reach (the shim's count alone includes the gateway's health checks, which
            are not drill traffic).

    Returns:
        A :class:`Reach`; ``felt`` None when ``faulted`` is empty or ``fault_at`` is None.
    """
    if not faulted or fault_at is None:
        return Reach(None, "no faulted replica or no injection time: nothing to trace")
    who = replica_of or {}
    ends = [t for t in (_t(r, "end_at") or _t(r, "sent_at") for r in records) if t is not None]
    end = fault_end if fault_end is not None else max(ends, default=fault_at)
    end = max(end, fault_at + 1e-6)
    before = [r for r in records if (_t(r, "sent_at") or fault_at) < fault_at]
    window = [
        r
        for r in records
        if _t(r, "sent_at") is not None
        and float(r["sent_at"]) < end
        and (_t(r, "end_at") is None or float(r["end_at"]) >= fault_at)
    ]
    names = ", ".join(faulted)
    identified = any(_identity(r, who) for r in records)
    failed = [r for r in window if not r.get("ok") and not r.get("cut_off")]
    failed_here = [r for r in failed if _is(_identity(r, who), faulted)]
    if not identified:
        return _anonymous(before, window, failed, names)
    ok_before = [r for r in before if r.get("ok")]
    mine_before = [r for r in ok_before if _is(_identity(r, who), faulted)]
    base = serving_counts(records, float("-inf"), fault_at, who)
    if not mine_before:
        return Reach(
            False,
            f"{MISSED}: {names} served none of the {len(ok_before)} requests answered before "
            f"it (served by: {_counts(base)})",
        )
    if not change_needed:
        # the fault's own record (the shim's delayed chunks) also counts the gateway's health
        # checks through the shim: only the drill's requests on the faulted replica during the
        # fault say the drill's traffic crossed it
        crossed = [
            r
            for r in window
            if fault_at <= (_t(r, "sent_at") or fault_at) < end and _is(_identity(r, who), faulted)
        ]
        if not crossed:
            return Reach(
                False,
                f"{MISSED}: {names} served {len(mine_before)} of {len(ok_before)} requests before "
                "it and none of the drill's requests sent during it (the delay applied was to "
                "other traffic, such as the gateway's health checks)",
            )
        return Reach(
            True,
            f"the traffic crossed it: {names} served {len(mine_before)} of {len(ok_before)} "
            f"requests before it and {len(crossed)} of the drill's requests during it",
        )
    ok_window = [r for r in window if r.get("ok") and (_t(r, "sent_at") or 0.0) >= fault_at]
    mine_window = [r for r in ok_window if _is(_identity(r, who), faulted)]
    signs: list[str] = []
    if failed_here:
        signs.append(f"{len(failed_here)} of its requests failed")
    med_b = statistics.median(_e2e(mine_before)) if _e2e(mine_before) else None
    med_w = statistics.median(_e2e(mine_window)) if _e2e(mine_window) else None
    if (
        med_b is not None
        and med_w is not None
        and med_w >= SLOWED_FACTOR * med_b
        and med_w - med_b >= SLOWED_MIN_S
    ):
        signs.append(f"slowed (median E2E {med_b:.3g} s -> {med_w:.3g} s)")
    share_b = len(mine_before) / len(ok_before)
    share_w = len(mine_window) / len(ok_window) if ok_window else None
    if share_w is not None and share_w <= MOVED_SHARE * share_b:
        signs.append(f"moved (share of answers {share_b:.0%} -> {share_w:.0%})")
    t0 = min((_t(r, "sent_at") or fault_at for r in before), default=fault_at)
    gap_b = _longest_gap([_t(r, "end_at") or 0.0 for r in mine_before], t0, fault_at)
    mine_ends = [
        _t(r, "end_at") or 0.0 for r in records if r.get("ok") and _is(_identity(r, who), faulted)
    ]
    gap_w = _longest_gap(mine_ends, fault_at, end)
    if gap_w > PAUSE_MIN_S and gap_w > PAUSE_FACTOR * gap_b:
        signs.append(f"paused ({gap_w:.3g} s without an answer, {gap_b:.3g} s at most before)")
    seen = (
        f"{names} served {len(mine_before)} of {len(ok_before)} requests before it and "
        f"{len(mine_window)} of {len(ok_window)} during it"
    )
    if signs:
        return Reach(True, f"the traffic felt it: {seen}; " + "; ".join(signs))
    slow = f", median E2E {med_b:.3g} s -> {med_w:.3g} s" if med_w is not None else ""
    return Reach(False, f"{MISSED}: {seen}, none failed, moved or paused{slow}")


def _anonymous(
    before: Sequence[Mapping[str, Any]],
    window: Sequence[Mapping[str, Any]],
    failed: Sequence[Mapping[str, Any]],
    names: str,
) -> Reach:
    """The service-level signs when no record names its engine (see the module docstring)."""
    why = f"the records name no engine (no X-Replica-Id), so a move off {names} cannot be seen"
    if failed:
        return Reach(
            True, f"the traffic felt it: {len(failed)} requests failed in the fault window ({why})"
        )
    med_b = _e2e([r for r in before if r.get("ok")])
    med_w = _e2e([r for r in window if r.get("ok")])
    if med_b and med_w:
        b, w = statistics.median(med_b), statistics.median(med_w)
        if w >= SLOWED_FACTOR * b and w - b >= SLOWED_MIN_S:
            return Reach(
                True, f"the traffic felt it: slowed (median E2E {b:.3g} s -> {w:.3g} s; {why})"
            )
    return Reach(False, f"{MISSED}: no request failed or slowed in the fault window; {why}")


def quota_reach(
    records: Sequence[Mapping[str, Any]],
    fault_at: float | None,
    fault_end: float | None,
    replica_of: Mapping[str, str] | None = None,
) -> Reach:
    """quota-cut without named victims (a cluster scales its Deployment down; the ReplicaSet
    picks the pods): the cut reached the traffic when fewer engines answered during the cut
    than before it (:func:`serving_counts`).

    Returns:
        A :class:`Reach`; ``felt`` None without ``fault_at``; False when as many engines served
        during the cut as before (or when no record names its engine).
    """
    if fault_at is None:
        return Reach(None, "no injection time: nothing to trace")
    ends = [t for t in (_t(r, "end_at") or _t(r, "sent_at") for r in records) if t is not None]
    end = fault_end if fault_end is not None else max(ends, default=fault_at)
    before = serving_counts(records, float("-inf"), fault_at, replica_of)
    during = serving_counts(records, fault_at, max(end, fault_at + 1e-6), replica_of)
    if not before and not during:
        return Reach(False, f"{MISSED}: the records name no engine (no X-Replica-Id)")
    seen = f"{len(before)} engines served before the cut ({_counts(before)}), {len(during)} during it ({_counts(during)})"
    if during and len(during) < len(before):
        return Reach(True, f"the traffic felt it: {seen}")
    return Reach(False, f"{MISSED}: {seen}")


def confirm_by_traffic(
    tl: Timeline,
    drill: str,
    ground: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    replica_of: Mapping[str, str] | None = None,
) -> Timeline:
    """``tl`` with the traffic's say: unchanged when its ground truth already says the fault did
    not act (``confirmed`` False) or there is nothing to trace (:func:`traffic_reach` None);
    ``confirmed`` False with :data:`MISSED` in ``why`` when the traffic did not feel it;
    unchanged too for a confirmed engine fault (its ledger lists the drill's own requests it
    sabotaged: the traffic felt it by construction, even when armed before the load); else
    ``confirmed`` True (a Kubernetes action's own record, or no lab ground truth, confirmed by
    the traffic) with the signs appended to ``why``."""
    if tl.confirmed is False:
        return tl
    if tl.confirmed and "sabotaged_request_ids" in ground:
        return tl  # an engine fault: its ledger names the drill's own requests it sabotaged
    names = faulted_names(drill, ground)
    if drill == "quota-cut" and not names:  # a cluster: the pods the ReplicaSet removed are unnamed
        reach = quota_reach(records, tl.fault_at, tl.fault_end, replica_of)
    else:
        # network-jitter: the shim's applied delay is the traffic's own (its chunks)
        change = not (drill == "network-jitter" and tl.confirmed is True)
        reach = traffic_reach(records, names, tl.fault_at, tl.fault_end, replica_of, change)
    if reach.felt is None:
        return tl
    if reach.felt:
        return replace(tl, confirmed=True, why=f"{tl.why}; {reach.why}")
    hint = next((h for k, h in HINTS.items() if ground.get(k)), None)
    why = f"{reach.why} ({tl.why}{'; ' + hint if hint else ''})"
    return replace(tl, confirmed=False, why=why)
