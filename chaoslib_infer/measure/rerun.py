"""Re-runs the fault caused against duplicates the client or gateway caused
(``docs/definitions.md``, "Re-runs and duplicates").

A logical request the engine generated more than once has paid for its answer more than once.
Who caused it decides which budget pays:

* a **re-run** (``rerun_generations``): the fault aborted a generation under a stream in
  flight (:mod:`chaoslib_infer.measure.faultcut`: a killed replica, a dropped node) and the
  request was generated again, on a survivor. The fault's cost (``fault_cut_generations``,
  ``fault_wasted_tokens``), not the retry policy's: retrying a cut stream is the right reaction.
* a **duplicate** (``duplicate_generations``, ``extra_generations``, ``wasted_tokens``): every
  other generation beyond the one the request needed. The engine went on generating (a slowed
  replica, a frozen one that thawed) while the client or the gateway sent the request again:
  their retry policy's cost, judged by the retry-cost criteria. ``frozen_completed`` counts the
  requests a frozen replica went on generating after it thawed while their client had already
  retried elsewhere: duplicates, which the client's timeout caused.

All counts are from the engine's generation ledger; without a ledger line for any of the
drill's requests every ledger figure is None (unmeasured), never 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .faultcut import CutAttempt, fault_cut, taken_replicas
from .retrycost import generation_counts, wasted_tokens

__all__ = [
    "FREEZE_KINDS",
    "LEDGER_FIGURES",
    "fault_cut_lost",
    "frozen_completed",
    "rerun_figures",
    "rerun_split",
]

Record = Mapping[str, Any]

#: Fault kinds that freeze a replica: its generations resume when it thaws.
FREEZE_KINDS = frozenset({"upstream-timeout"})

#: The ledger figures of this module, None (unmeasured) without a ledger.
LEDGER_FIGURES = (
    "rerun_generations",
    "rerun_requests",
    "fault_cut_generations",
    "fault_wasted_tokens",
    "fault_wasted_prompt_tokens",
    "duplicate_generations",
    "extra_generations",
    "wasted_tokens",
    "wasted_completion_tokens",
)


def _unmeasured(cut_attempts: int) -> dict[str, Any]:
    return {**dict.fromkeys(LEDGER_FIGURES), "fault_cut_attempts": cut_attempts}


def rerun_split(
    records: Iterable[Record], ledger: Iterable[Mapping[str, Any]], cuts: Sequence[CutAttempt]
) -> dict[str, Any]:
    """Split the drill's multiple generations into the fault's re-runs and the duplicates.

    Per logical request generated ``n`` times, ``k`` of them aborted by the fault (distinct
    aborted generations among ``cuts``): each aborted generation followed by a later generation
    of the request is a re-run; the generations beyond the one the request needed among the
    ``n - k`` others are duplicates (``max(0, n - k - 1)``).

    Args:
        records: the drill's attempt records (their ``request_id`` select ledger lines).
        ledger: the engine's generation ledger lines.
        cuts: the fault-cut attempts (:func:`chaoslib_infer.measure.faultcut.fault_cut`).

    Returns:
        ``rerun_generations`` (generations that re-ran one the fault aborted),
        ``rerun_requests`` (logical requests with one), ``fault_cut_generations`` (generations
        the fault aborted), ``fault_wasted_tokens`` (prompt + completion tokens those had spent:
        from the ledger's end lines where the dying engine wrote them; None, unmeasured, when
        one did not, as a killed process does not), ``fault_wasted_prompt_tokens`` (their
        prompts' tokens, which the re-run prefilled again: from the request's other end lines;
        None when unknown), ``fault_cut_attempts`` (attempts the fault cut, with or without a
        ledger), and the client's and gateway's part: ``duplicate_generations`` (requests with
        a duplicate), ``extra_generations`` (duplicates summed), ``wasted_tokens`` and
        ``wasted_completion_tokens`` (tokens of the duplicates, as
        :func:`chaoslib_infer.measure.retrycost.wasted_tokens`, the aborted generations left
        out). Ledger figures are None (unmeasured) when the ledger holds no ``generation``
        line for these requests.
    """
    ids = {str(r["request_id"]) for r in records if r.get("request_id") is not None}
    ledger_list = list(ledger)
    counts = {rid: n for rid, n in generation_counts(ledger_list).items() if rid in ids}
    if not counts:
        return _unmeasured(len(cuts))
    aborted: dict[str, set[tuple[str, int | None, float]]] = {}
    spent: dict[tuple[str, int | None, float], int | None] = {}
    for c in cuts:
        if c.generation_at is None or c.request_id not in counts:
            continue
        key = (c.replica, c.pid, c.generation_at)
        aborted.setdefault(c.request_id, set()).add(key)
        spent[key] = c.spent_tokens
    starts: dict[str, list[float]] = {}
    prompt: dict[str, int] = {}
    dropped = {(rid, rep, pid) for rid, keys in aborted.items() for rep, pid, _ in keys}
    kept: list[Mapping[str, Any]] = []
    for e in ledger_list:
        rid = e.get("request_id")
        if not isinstance(rid, str) or rid not in counts:
            continue
        event = e.get("event", "generation")
        if event == "generation" and isinstance(e.get("t"), int | float):
            starts.setdefault(rid, []).append(float(e["t"]))
        if event == "generation_end":
            pt = e.get("prompt_tokens")
            if isinstance(pt, int):
                prompt.setdefault(rid, pt)
            if (rid, e.get("replica"), e.get("pid")) in dropped:
                continue  # the aborted generation's own end line: the fault's, not a duplicate
        kept.append(e)
    reruns: dict[str, int] = {}
    for rid, keys in aborted.items():
        reruns[rid] = sum(1 for _, _, t0 in keys if any(t > t0 for t in starts.get(rid, [])))
    client = {rid: n - len(aborted.get(rid, ())) for rid, n in counts.items()}
    extra = {rid: max(0, n - 1) for rid, n in client.items()}
    waste = wasted_tokens(kept, {rid: n for rid, n in client.items() if n > 0})
    gens = [k for ks in aborted.values() for k in ks]
    fault_spent = [spent[k] for k in gens]
    prompts = [prompt.get(rid) for rid, ks in aborted.items() for _ in ks]
    return {
        "rerun_generations": sum(reruns.values()),
        "rerun_requests": sum(1 for n in reruns.values() if n > 0),
        "fault_cut_generations": len(gens),
        "fault_wasted_tokens": (
            sum(s for s in fault_spent if s is not None)
            if all(s is not None for s in fault_spent)
            else None
        ),
        "fault_wasted_prompt_tokens": (
            sum(p for p in prompts if p is not None)
            if all(p is not None for p in prompts)
            else None
        ),
        "fault_cut_attempts": len(cuts),
        "duplicate_generations": sum(1 for n in extra.values() if n > 0),
        "extra_generations": sum(extra.values()),
        "wasted_tokens": waste["wasted_tokens"],
        "wasted_completion_tokens": waste["wasted_completion_tokens"],
    }


def fault_cut_lost(records: Iterable[Record], cuts: Sequence[CutAttempt]) -> int:
    """Logical requests lost to the fault's cut: their last attempt is one the fault cut (no
    retry followed it, or none succeeded after it). A count of requests."""
    cut = {(c.request_id, c.attempt) for c in cuts}
    last: dict[str, int] = {}
    for r in records:
        rid = r.get("request_id")
        if rid is not None:
            last[str(rid)] = max(last.get(str(rid), 0), int(r.get("attempt") or 1))
    return sum(1 for rid, n in last.items() if (rid, n) in cut)


def frozen_completed(
    records: Iterable[Record],
    ledger: Iterable[Mapping[str, Any]],
    faults: Iterable[Mapping[str, Any]],
) -> int | None:
    """Logical requests a frozen replica generated after it thawed while their client had
    already sent them again: the request was first sent before the thaw, the frozen replica's
    ``generation_end`` of it is at or after the thaw (outcome ``done``, or ``cancelled`` when the
    thawed engine found the client gone: the engine went on with it, nothing aborted it), and it
    has another generation. Duplicates the client's timeout caused (it gave up on a replica that
    was going to resume), counted in ``duplicate_generations`` too.

    Args:
        records: attempt records (their request ids, ``sent_at``).
        ledger: the engine's generation ledger.
        faults: ``faults.jsonl`` lines; the freezes are those of :data:`FREEZE_KINDS`
            (``replica``, ``fault_at``, ``hold_s``; the thaw is ``fault_at + hold_s``, or the
            ``held_until`` / ``cleared_at`` of a later line of its kind when earlier).

    Returns:
        The count; None when the drill froze no replica or the ledger holds no line of these
        requests (unmeasured).
    """
    fault_list = list(faults)
    freezes: list[tuple[str, float, float]] = []
    for f in fault_list:
        if f.get("kind") not in FREEZE_KINDS or f.get("phase", "injected") != "injected":
            continue
        at, hold = f.get("fault_at"), f.get("hold_s")
        if not isinstance(at, int | float) or not isinstance(f.get("replica"), str):
            continue
        thaw = float(at) + float(hold) if isinstance(hold, int | float) else float("inf")
        for g in fault_list:
            cleared = g.get("held_until", g.get("cleared_at", g.get("at")))
            if (
                g.get("kind") == f.get("kind")
                and g.get("phase") in ("held", "cleared")
                and isinstance(cleared, int | float)
                and cleared >= float(at)
            ):
                thaw = min(thaw, float(cleared))
        freezes.append((str(f["replica"]), float(at), thaw))
    if not freezes:
        return None
    first_sent: dict[str, float] = {}
    for r in records:
        rid, sent = r.get("request_id"), r.get("sent_at")
        if rid is not None and isinstance(sent, int | float):
            first_sent[str(rid)] = min(first_sent.get(str(rid), float(sent)), float(sent))
    ledger_list = [e for e in ledger if str(e.get("request_id")) in first_sent]
    counts = generation_counts(ledger_list)
    if not counts:
        return None
    found: set[str] = set()
    for rep, _, thaw in freezes:
        for e in ledger_list:
            rid, t = str(e.get("request_id")), e.get("t")
            if (
                e.get("event") == "generation_end"
                and e.get("replica") == rep
                and e.get("outcome") in ("done", "cancelled")
                and isinstance(t, int | float)
                and float(t) >= thaw
                and first_sent[rid] < thaw
                and counts.get(rid, 0) > 1
            ):
                found.add(rid)
    return len(found)


def rerun_figures(
    records: Sequence[Record],
    ledger: Sequence[Mapping[str, Any]],
    faults: Sequence[Mapping[str, Any]],
    lab_events: Sequence[Mapping[str, Any]] = (),
    killed: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The re-run / duplicate figures of one drill on the lab: :func:`rerun_split` over the
    attempts the drill's faults cut (:func:`chaoslib_infer.measure.faultcut.fault_cut`, the
    replicas of ``faults.jsonl``), plus ``frozen_completed`` (:func:`frozen_completed`) when
    the drill froze a replica. Also ``duplicates`` (= ``duplicate_generations``: the common
    figure of the same name) and ``fault_cut_lost`` (:func:`fault_cut_lost`).

    ``killed``: ``{pod: unix s}`` of the pods a Kubernetes action deleted or OOM-killed
    (:func:`chaoslib_infer.measure.faultcut.taken_pods`): their processes died, so a stream cut
    on one (its ``X-Replica-Id`` in the record's ``replica``) is fault-cut without a ledger."""
    cuts = fault_cut(records, taken_replicas(faults), ledger, lab_events)
    if killed:
        seen = {(c.request_id, c.attempt) for c in cuts}
        more = fault_cut(records, killed, ledger, lab_events, process_died=True)
        cuts += [c for c in more if (c.request_id, c.attempt) not in seen]
    out = rerun_split(records, ledger, cuts)
    out["duplicates"] = out["duplicate_generations"]
    out["fault_cut_lost"] = fault_cut_lost(records, cuts)
    if out["rerun_generations"] is None and not cuts:  # no ledger: nothing shows an abort
        out["fault_cut_attempts"] = out["fault_cut_lost"] = None
    if any(f.get("kind") in FREEZE_KINDS for f in faults):
        out["frozen_completed"] = frozen_completed(records, ledger, faults)
    return out
