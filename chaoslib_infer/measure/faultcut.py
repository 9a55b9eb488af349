"""Which attempts the fault itself cut (``docs/definitions.md``, "Re-runs and duplicates").

An attempt is **fault-cut** when all of these hold:

* it was in flight on a replica the fault *took* (killed, or whose node it dropped): the lab's
  fault record (``faults.jsonl``: ``replica`` / ``replicas``, ``fault_at``, of the kinds in
  :data:`TAKING_KINDS`), or on Kubernetes the pods the action deleted (:func:`taken_pods`), the
  attempt's replica read from its record (``replica``: the response's ``X-Replica-Id``) or,
  without one, from the engine ledger's ``generation`` line of its request on that replica;
* it was sent before the fault and ended after it (unix seconds, ``sent_at <= fault_at <=
  end_at``);
* it failed as a killed replica's stream fails (``reset``, ``truncated``) or as a dropped
  node's goes silent (``timeout_idle``, ``timeout_ttft``): :data:`CUT_CLASSES`;
* and the engine did **not** finish its generation by the fault: the ledger's
  ``generation_end`` line of that request, replica and pid is absent, or the replica's process
  (that pid) died (the lab's ``exit`` event) with the generation unfinished (an end line other
  than ``"done"``), or its ``"done"`` line is stamped after the fault took the replica (an
  answer finished into a cut link, which the client's failed stream shows never arrived). A
  generation that went on and ended after the client gave up (a frozen replica that thawed, a
  slowed one) is not fault-cut: its re-send is a duplicate the client's timeout caused.

Pure functions over records, fault lines, ledger lines and lab events (all times unix seconds).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CUT_CLASSES",
    "TAKING_KINDS",
    "CutAttempt",
    "fault_cut",
    "taken_pods",
    "taken_replicas",
]

Record = Mapping[str, Any]

#: Fault kinds that take a replica away under its streams: the process is killed (oom-kill,
#: simultaneous-restarts) or its node dropped and its processes killed (node-loss). A frozen
#: (upstream-timeout) or slowed (network-jitter) replica is not taken: it goes on generating.
TAKING_KINDS = frozenset({"oom-kill", "simultaneous-restarts", "node-loss"})

#: How a stream the fault cut fails at the client: a killed replica resets or truncates it; a
#: dropped node leaves it silent until the client's idle or first-token timeout.
CUT_CLASSES = frozenset({"reset", "truncated", "timeout_idle", "timeout_ttft"})

#: How far before its attempt's send a ledger ``generation`` line may be stamped (s): the
#: engine and the client read one machine's clock, so only rounding separates them.
CLOCK_SLACK_S = 0.05


@dataclass(frozen=True)
class CutAttempt:
    """One attempt the fault cut, and the generation it aborted.

    Attributes:
        request_id: the logical request.
        attempt: the attempt number (1 = first send).
        replica: the replica (or pod) the fault took under it.
        fault_at: when the fault took that replica (unix s).
        pid: the engine process of the aborted generation (None: no ledger line found).
        generation_at: when that generation started (unix s; None: no ledger line found).
        spent_tokens: prompt + completion tokens the aborted generation had spent, from its
            ledger end line when it wrote one before dying; None (unmeasured, never 0) when the
            ledger does not say.
    """

    request_id: str
    attempt: int
    replica: str
    fault_at: float
    pid: int | None
    generation_at: float | None
    spent_tokens: int | None


def _f(v: Any) -> float | None:
    """``v`` as a finite float, or None."""
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def taken_replicas(faults: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """``{replica: fault_at}`` of the replicas the drill's faults took (:data:`TAKING_KINDS`;
    the injected lines of ``faults.jsonl``: ``replica`` or ``replicas``, ``fault_at`` in unix
    seconds; a replica taken twice keeps its first time)."""
    out: dict[str, float] = {}
    for f in faults:
        if f.get("kind") not in TAKING_KINDS or f.get("phase", "injected") != "injected":
            continue
        at = _f(f.get("fault_at"))
        if at is None:
            continue
        names = f.get("replicas") or [f.get("replica")]
        for name in names if isinstance(names, list) else [names]:
            if isinstance(name, str) and name:
                out[name] = min(out.get(name, at), at)
    return out


def taken_pods(pods: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """``{pod: deleted_at}`` of the pods a Kubernetes action deleted (its journal's ``pods``
    rows ``{"pod", "deleted_at"}``, unix s): the records' ``replica`` is the pod's
    ``X-Replica-Id``. A deleted pod's process died, so its streams' generations are aborted."""
    out: dict[str, float] = {}
    for p in pods:
        name, at = p.get("pod"), _f(p.get("deleted_at"))
        if isinstance(name, str) and name and at is not None:
            out[name] = min(out.get(name, at), at)
    return out


def _deaths(lab_events: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], float]:
    """``{(replica, pid): exit time}`` from the lab's ``exit`` events."""
    out: dict[tuple[str, int], float] = {}
    for e in lab_events:
        t = _f(e.get("t"))
        if e.get("event") != "exit" or t is None:
            continue
        rep, pid = e.get("replica"), e.get("pid")
        if isinstance(rep, str) and isinstance(pid, int):
            out[(rep, pid)] = t
    return out


def fault_cut(
    records: Iterable[Record],
    taken: Mapping[str, float],
    ledger: Iterable[Mapping[str, Any]],
    lab_events: Iterable[Mapping[str, Any]] = (),
    process_died: bool = False,
) -> list[CutAttempt]:
    """The attempts the fault cut (module docstring), in record order.

    Args:
        records: attempt records (``request_id``, ``attempt``, ``replica``, ``sent_at``,
            ``end_at``, ``ok``, ``error_class``).
        taken: ``{replica or pod: fault_at}`` (:func:`taken_replicas`, :func:`taken_pods`).
        ledger: the engine's generation ledger (``generation`` / ``generation_end`` lines);
            [] where the target has none.
        lab_events: the lab's events (``exit`` lines with ``replica`` and ``pid``); [] off the lab.
        process_died: the taken replicas' processes are known dead (a deleted pod, a killed
            container): their generations are aborted without a ledger to say so.

    Returns:
        One :class:`CutAttempt` per fault-cut attempt. Without a ledger line for an attempt's
        generation the attempt counts only with ``process_died`` (nothing else shows that the
        engine did not finish it); its ``pid`` and ``generation_at`` are then None.
    """
    if not taken:
        return []
    ledger_list = list(ledger)
    starts: dict[tuple[str, str], list[tuple[float, int | None]]] = {}
    ends: dict[tuple[str, str, int | None], list[tuple[float, str, int | None]]] = {}
    for e in ledger_list:
        rid, rep, t = e.get("request_id"), e.get("replica"), _f(e.get("t"))
        if not isinstance(rid, str) or not isinstance(rep, str) or t is None:
            continue
        pid = e.get("pid") if isinstance(e.get("pid"), int) else None
        event = e.get("event", "generation")
        if event == "generation":
            starts.setdefault((rid, rep), []).append((t, pid))
        elif event == "generation_end":
            pt, ct = e.get("prompt_tokens"), e.get("completion_tokens")
            spent = pt + ct if isinstance(pt, int) and isinstance(ct, int) else None
            ends.setdefault((rid, rep, pid), []).append((t, str(e.get("outcome")), spent))
    deaths = _deaths(lab_events)
    out: list[CutAttempt] = []
    for r in records:
        rid = r.get("request_id")
        sent, end = _f(r.get("sent_at")), _f(r.get("end_at"))
        if r.get("ok") or not isinstance(rid, str) or sent is None or end is None:
            continue
        if r.get("error_class") not in CUT_CLASSES:
            continue
        rep = r.get("replica")
        candidates = [rep] if isinstance(rep, str) and rep in taken else list(taken)
        if isinstance(rep, str) and rep and rep not in taken:
            continue  # served by a replica the fault did not take
        for name in candidates:
            at = taken[name]
            if not sent <= at <= end:
                continue
            gens = [
                (t, pid)
                for t, pid in starts.get((rid, name), [])
                if sent - CLOCK_SLACK_S <= t <= min(at, end) + CLOCK_SLACK_S
            ]
            if not gens:
                if process_died and isinstance(rep, str) and rep == name:
                    n = int(r.get("attempt") or 1)
                    out.append(CutAttempt(rid, n, name, at, None, None, None))
                    break
                continue  # it never generated on the taken replica: nothing aborted
            t0, pid = gens[-1]
            done = [x for x in ends.get((rid, name, pid), []) if x[0] >= t0]
            died = deaths.get((name, pid)) if pid is not None else None
            if any(o == "done" and t <= at for t, o, _ in done):
                continue  # the engine finished it: not aborted (a duplicate, if re-sent)
            # a "done" after the fault took the replica was written into a cut link (the
            # client's stream failed): its answer never arrived, the fault aborted it
            late = any(o == "done" for _, o, _ in done)
            if done and not late and died is None and not process_died:
                continue  # it ended (cancelled) in a live process: the client went away
            spent = next((s for _, _, s in done if s is not None), None)
            out.append(CutAttempt(rid, int(r.get("attempt") or 1), name, at, pid, t0, spent))
            break
    return out
