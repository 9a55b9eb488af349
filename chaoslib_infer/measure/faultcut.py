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

The same rule for the faults that hold a replica's streams without killing it, and for the
engine's own faults (one rule for every drill: a stream the fault cut and the client re-ran is
the fault's re-run, never a client duplicate):

* **a freeze** (:func:`frozen_cut`, :data:`FREEZE_KINDS`): an attempt on the frozen replica that
  failed, ended after the freeze and was sent before the thaw, whose generation there the engine
  ended ``cancelled`` by :data:`THAW_GRACE_S` after the thaw (its first steps after the thaw
  found the client gone; a frozen engine writes nothing, so an end line after the freeze was
  written at the thaw): the freeze cut it. A generation that ended ``done`` after the thaw,
  or ``cancelled`` later than the grace, went on producing tokens nobody got: not fault-cut
  (a duplicate, ``frozen_completed``); one with no end line yet is still held by the thawed
  engine: no cut either;
* **an engine fault** (:func:`engine_fault_cut`, :data:`ENGINE_CUT_MODES`): the engine's ledger
  ``fault`` line names the request, and the attempt it sabotaged failed: the engine itself broke
  the answer (reset after k tokens, truncated, garbled, empty, an error in the stream), so a
  retry of it is the right reaction; a ``stall`` counts only when the stalled generation ended
  ``cancelled`` (the engine found the client gone when it resumed), not ``done``.

Pure functions over records, fault lines, ledger lines and lab events (all times unix seconds).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CUT_CLASSES",
    "ENGINE_CUT_MODES",
    "FREEZE_KINDS",
    "TAKING_KINDS",
    "THAW_GRACE_S",
    "CutAttempt",
    "Freeze",
    "engine_fault_cut",
    "fault_cut",
    "freezes",
    "frozen_cut",
    "taken_pods",
    "taken_replicas",
]

Record = Mapping[str, Any]

#: Fault kinds that take a replica away under its streams: the process is killed (oom-kill,
#: simultaneous-restarts) or its node dropped and its processes killed (node-loss). A frozen
#: (upstream-timeout) or slowed (network-jitter) replica is not taken: it goes on generating.
TAKING_KINDS = frozenset({"oom-kill", "simultaneous-restarts", "node-loss"})

#: Fault kinds that freeze a replica: its generations resume when it thaws.
FREEZE_KINDS = frozenset({"upstream-timeout"})

#: Engine fault modes that break the answer of the generation they sabotage (the ledger's
#: ``fault`` line names the request): a client's retry of it re-runs what the engine broke.
#: ``stall`` counts only when the stalled generation ended ``cancelled`` (:func:`engine_fault_cut`).
ENGINE_CUT_MODES = frozenset(
    {"reset_after_k", "truncated", "error_in_stream", "empty", "garbled", "stall"}
)

#: How long after a thaw (s) a frozen generation may end ``cancelled`` and still count as cut by
#: the freeze: a real engine sees a gone client within a decode step or two (10-30 ms each), a
#: gateway that held the connection at its first write after the thaw. Later, the engine went on
#: producing tokens nobody got (a duplicate).
THAW_GRACE_S = 0.5

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
        sent_at: the attempt's send (unix s; None when not known): a later generation of the
            request re-ran it.
        how: what cut it: ``"taken"`` (killed, node dropped), ``"frozen"``, or the engine
            fault's mode (``"reset_after_k"``, ...).
    """

    request_id: str
    attempt: int
    replica: str
    fault_at: float
    pid: int | None
    generation_at: float | None
    spent_tokens: int | None
    sent_at: float | None = None
    how: str = "taken"


def _f(v: Any) -> float | None:
    """``v`` as a finite float, or None."""
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _failed(records: Iterable[Record]) -> Iterator[tuple[Record, str, float, float]]:
    """``(record, request_id, sent_at, end_at)`` of each failed attempt that has all three."""
    for r in records:
        rid = r.get("request_id")
        sent, end = _f(r.get("sent_at")), _f(r.get("end_at"))
        if not r.get("ok") and isinstance(rid, str) and sent is not None and end is not None:
            yield r, rid, sent, end


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
    starts, ends = _lines(ledger)  # in time order, as the ledger writes them
    deaths = _deaths(lab_events)
    out: list[CutAttempt] = []
    for r, rid, sent, end in _failed(records):
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
                    out.append(CutAttempt(rid, n, name, at, None, None, None, sent))
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
            n = int(r.get("attempt") or 1)
            out.append(CutAttempt(rid, n, name, at, pid, t0, spent, sent))
            break
    return out


@dataclass(frozen=True)
class Freeze:
    """One freeze of a replica: ``replica``, ``at`` (the freeze, unix s), ``thaw`` (unix s;
    ``inf`` when the fault lines do not say)."""

    replica: str
    at: float
    thaw: float


def freezes(
    faults: Iterable[Mapping[str, Any]], lab_events: Iterable[Mapping[str, Any]] = ()
) -> list[Freeze]:
    """The drill's freezes (:data:`FREEZE_KINDS`) from ``faults.jsonl`` (the injected line's
    ``replica`` and ``fault_at``) and the thaw, in this order of preference:

    * the lab's ``fault`` event of that kind and replica with ``phase`` ``"cleared"`` (the first
      at or after the freeze): stamped right after the thaw write, so an upper bound of the thaw
      (a frozen engine writes nothing, so any ledger line of it after the freeze is at the thaw;
      the replica stays frozen past the action's hold until the rollback thaws it);
    * else the ``cleared_at`` of a later ``cleared`` line of ``faults.jsonl``;
    * else the hold's end: a ``held`` line's ``held_until``, or ``fault_at + hold_s``;
    * else ``inf``.
    """
    fault_list = list(faults)
    events = [e for e in lab_events if e.get("event") == "fault" and e.get("phase") == "cleared"]
    out: list[Freeze] = []
    for f in fault_list:
        if f.get("kind") not in FREEZE_KINDS or f.get("phase", "injected") != "injected":
            continue
        at, hold = _f(f.get("fault_at")), _f(f.get("hold_s"))
        rep = f.get("replica")
        if at is None or not isinstance(rep, str):
            continue
        cleared = [
            t
            for e in events
            if e.get("kind") == f.get("kind")
            and e.get("replica") == rep
            and (t := _f(e.get("t"))) is not None
            and t >= at
        ]
        logged = [
            t
            for g in fault_list
            if g.get("kind") == f.get("kind")
            and g.get("phase") == "cleared"
            and (t := _f(g.get("cleared_at", g.get("fault_at")))) is not None
            and t >= at
        ]
        held = [
            t
            for g in fault_list
            if g.get("kind") == f.get("kind")
            and g.get("phase") == "held"
            and (t := _f(g.get("held_until"))) is not None
            and t >= at
        ]
        thaw = min(cleared or logged or held or [at + hold if hold is not None else math.inf])
        out.append(Freeze(rep, at, thaw))
    return out


def _lines(
    ledger: Iterable[Mapping[str, Any]],
) -> tuple[
    dict[tuple[str, str], list[tuple[float, int | None]]],
    dict[tuple[str, str, int | None], list[tuple[float, str, int | None]]],
]:
    """``(starts, ends)``: ``{(request, replica): [(t, pid)]}`` of the ``generation`` lines and
    ``{(request, replica, pid): [(t, outcome, prompt + completion tokens)]}`` of the ends."""
    starts: dict[tuple[str, str], list[tuple[float, int | None]]] = {}
    ends: dict[tuple[str, str, int | None], list[tuple[float, str, int | None]]] = {}
    for e in ledger:
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
    for v in starts.values():
        v.sort(key=lambda x: x[0])
    for w in ends.values():
        w.sort(key=lambda x: x[0])
    return starts, ends


def frozen_cut(
    records: Iterable[Record], frozen: Iterable[Freeze], ledger: Iterable[Mapping[str, Any]]
) -> list[CutAttempt]:
    """The attempts a freeze cut (module docstring), in record order.

    Args:
        records: attempt records (``request_id``, ``attempt``, ``replica``, ``sent_at``,
            ``end_at``, ``ok``).
        frozen: the drill's freezes (:func:`freezes`).
        ledger: the engine's generation ledger; without a ``generation`` line of the attempt's
            request on the frozen replica nothing shows the freeze held it: not counted.

    Returns:
        One :class:`CutAttempt` (``how`` ``"frozen"``, ``fault_at`` the freeze) per attempt
        whose generation on the frozen replica the freeze cut; ``spent_tokens`` from its end
        line (None without one).
    """
    frozen_list = list(frozen)
    if not frozen_list:
        return []
    starts, ends = _lines(ledger)
    out: list[CutAttempt] = []
    for r, rid, sent, end in _failed(records):
        rep = r.get("replica")
        for fz in frozen_list:
            if isinstance(rep, str) and rep and rep != fz.replica:
                continue
            if not (sent < fz.thaw and end >= fz.at):
                continue
            gens = [
                (t, pid)
                for t, pid in starts.get((rid, fz.replica), [])
                if t >= sent - CLOCK_SLACK_S
            ]
            if not gens:
                continue
            t0, pid = gens[0]
            if t0 > fz.thaw + THAW_GRACE_S:
                continue  # generated long after the thaw: not held by the freeze
            done = [x for x in ends.get((rid, fz.replica, pid), []) if x[0] >= t0]
            if not done:
                # no end line by the time the evidence reads the ledger: the thawed engine still
                # holds the generation (the gateway kept its connection), so it went on; nothing
                # shows a cut
                continue
            t_end, outcome, spent = done[0]
            if t_end < fz.at or outcome != "cancelled" or t_end > fz.thaw + THAW_GRACE_S:
                continue  # finished before the freeze, or went on after the thaw
            n = int(r.get("attempt") or 1)
            out.append(CutAttempt(rid, n, fz.replica, fz.at, pid, t0, spent, sent, "frozen"))
            break
    return out


def engine_fault_cut(
    records: Iterable[Record], ledger: Iterable[Mapping[str, Any]]
) -> list[CutAttempt]:
    """The attempts the engine's own fault broke (module docstring), in record order.

    Args:
        records: attempt records (``request_id``, ``attempt``, ``replica``, ``sent_at``,
            ``end_at``, ``ok``).
        ledger: the engine's ledger: its ``fault`` lines (``request_id``, ``replica``, ``pid``,
            ``mode``, ``t``: written when the engine chose to sabotage the request, before its
            ``generation`` line) and the generations.

    Returns:
        One :class:`CutAttempt` (``how`` the mode, ``fault_at`` the fault line's time) per
        failed attempt whose generation the engine sabotaged with a mode of
        :data:`ENGINE_CUT_MODES` (a ``stall`` only when its generation ended ``cancelled``).
    """
    ledger_list = list(ledger)
    starts, ends = _lines(ledger_list)
    sabotaged: dict[str, list[tuple[float, str, int | None, str]]] = {}
    for e in ledger_list:
        rid, rep, t, mode = e.get("request_id"), e.get("replica"), _f(e.get("t")), e.get("mode")
        if e.get("event") != "fault" or mode not in ENGINE_CUT_MODES:
            continue
        if isinstance(rid, str) and isinstance(rep, str) and t is not None:
            pid = e.get("pid") if isinstance(e.get("pid"), int) else None
            sabotaged.setdefault(rid, []).append((t, rep, pid, str(mode)))
    out: list[CutAttempt] = []
    for r, rid, sent, end in _failed(records):
        rep = r.get("replica")
        for t, name, pid, mode in sabotaged.get(rid, []):
            if isinstance(rep, str) and rep and rep != name:
                continue
            if not sent - CLOCK_SLACK_S <= t <= end + CLOCK_SLACK_S:
                continue
            gens = [
                g for g, p in starts.get((rid, name), []) if g >= t - CLOCK_SLACK_S and p == pid
            ]
            if not gens:
                continue  # it never generated: nothing to re-run
            done = [x for x in ends.get((rid, name, pid), []) if x[0] >= gens[0]]
            if mode == "stall" and (not done or done[0][1] != "cancelled"):
                continue  # the stalled engine went on and finished: a re-send is a duplicate
            spent = done[0][2] if done else None
            n = int(r.get("attempt") or 1)
            out.append(CutAttempt(rid, n, name, t, pid, gens[0], spent, sent, mode))
            break
    return out
