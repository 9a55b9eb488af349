"""Re-runs the fault caused against duplicates the client or gateway caused
(``docs/definitions.md``, "Re-runs and duplicates").

A logical request the engine generated more than once has paid for its answer more than once.
Who caused it decides which budget pays. One rule, in every drill:

* a **re-run** (``rerun_generations``): a stream in flight on a replica when the fault took it
  (:mod:`chaoslib_infer.measure.faultcut`: a killed replica, a dropped node, a frozen one whose
  engine ended the generation ``cancelled`` at its first steps after the thaw, a stream the
  engine's own fault reset, truncated or garbled) and generated again elsewhere. The fault's
  cost (``fault_cut_generations``, ``fault_wasted_tokens``), not the retry policy's: retrying
  a cut stream is the right reaction.
* a **duplicate** (``duplicate_generations``, ``extra_generations``, ``wasted_tokens``): every
  other generation beyond the one the request needed: the client or the gateway started the
  request again while the first generation went on producing tokens the user never got (the
  ledger shows it: it ended ``done``, or long after the client gave up). ``frozen_completed``
  counts the requests a frozen replica went on generating after its thaw (``done``, or
  ``cancelled`` later than :data:`~chaoslib_infer.measure.faultcut.THAW_GRACE_S`) while their
  client had already re-sent them; their wasted tokens are the tokens made after the thaw (what
  was generated twice), not the prompt and the tokens made before the freeze (the fault's).
  ``duplicate_causes`` says, per duplicated request, which mechanism its records and ledger
  show (:func:`duplicate_causes`): what the verdict's blame names.

All counts are from the engine's generation ledger; without a ledger line for any of the
drill's requests every ledger figure is None (unmeasured), never 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .faultcut import (
    CLOCK_SLACK_S,
    FREEZE_KINDS,
    THAW_GRACE_S,
    CutAttempt,
    Freeze,
    engine_fault_cut,
    fault_cut,
    freezes,
    frozen_cut,
    taken_replicas,
)
from .retrycost import generation_counts, wasted_tokens

__all__ = [
    "CAUSES",
    "FREEZE_KINDS",
    "LEDGER_FIGURES",
    "duplicate_causes",
    "fault_cut_lost",
    "frozen_completed",
    "frozen_resumed",
    "generations_after_client_left",
    "rerun_figures",
    "rerun_split",
]

Record = Mapping[str, Any]

#: The mechanisms :func:`duplicate_causes` tells apart, in the order it tries them.
CAUSES = (
    "frozen_resumed",
    "gateway_resent",
    "client_hedged",
    "client_gave_up",
    "stream_failed",
    "unexplained",
)

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


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _received(r: Record) -> int:
    """Output tokens the client received on attempt ``r`` (its ``output_tokens``, else its
    output chunks)."""
    n = r.get("output_tokens")
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    return len(r.get("chunk_times") or [])


def frozen_resumed(
    records: Iterable[Record],
    ledger: Iterable[Mapping[str, Any]],
    frozen: Sequence[Freeze],
    cuts: Sequence[CutAttempt] = (),
) -> dict[tuple[str, str, int | None], int]:
    """The generations a frozen replica went on with after its thaw, their client gone.

    A generation of a drill's request on a frozen replica, started before the thaw or within
    the grace after it (its attempt sent before the thaw: queued in the frozen socket), whose ``generation_end`` is at or after the thaw with outcome
    ``done``, or ``cancelled`` later than :data:`~chaoslib_infer.measure.faultcut.THAW_GRACE_S`
    after it, and that no fault cut (``cuts``).

    Returns:
        ``{(request_id, replica, pid): completion tokens made before the freeze}``: the tokens
        its attempt had received (``output_tokens``, else its chunks; 0 when no attempt of it
        failed on that replica): the tokens after the thaw are its end line's count minus these.
    """
    recs = [r for r in records if r.get("request_id") is not None]
    ids = {str(r["request_id"]) for r in recs}
    cut = {(c.request_id, c.replica, c.pid) for c in cuts}
    out: dict[tuple[str, str, int | None], int] = {}
    starts: dict[tuple[str, str, int | None], float] = {}
    for e in ledger:
        rid, rep, t = e.get("request_id"), e.get("replica"), _num(e.get("t"))
        if not isinstance(rid, str) or rid not in ids or not isinstance(rep, str) or t is None:
            continue
        pid = e.get("pid") if isinstance(e.get("pid"), int) else None
        key = (rid, rep, pid)
        if e.get("event", "generation") == "generation":
            starts.setdefault(key, t)
            continue
        if e.get("event") != "generation_end" or key in cut or key in out:
            continue
        for fz in frozen:
            t0 = starts.get(key, t)
            if rep != fz.replica or t < fz.at or t0 >= fz.thaw + THAW_GRACE_S:
                continue  # ended before the freeze (a frozen engine writes nothing until the
                # thaw), or started long after the thaw
            if not any(
                str(r["request_id"]) == rid and (_num(r.get("sent_at")) or fz.thaw) < fz.thaw
                for r in recs
            ):
                continue  # not sent before the thaw: the freeze did not hold it
            outcome = e.get("outcome")
            if outcome == "done" or (outcome == "cancelled" and t > fz.thaw + THAW_GRACE_S):
                mine = [
                    r
                    for r in recs
                    if str(r["request_id"]) == rid
                    and not r.get("ok")
                    and r.get("replica") in (rep, None)
                    and (_num(r.get("sent_at")) or 0.0) <= t0 + CLOCK_SLACK_S
                ]
                out[key] = max((_received(r) for r in mine), default=0)
                break
    return out


def _gens(
    ledger: Iterable[Mapping[str, Any]], counts: Mapping[str, int]
) -> dict[str, list[tuple[float, str, int | None]]]:
    """``{request_id: [(t, replica, pid)]}`` of the ``generation`` lines, by start."""
    out: dict[str, list[tuple[float, str, int | None]]] = {}
    for e in ledger:
        rid, rep, t = e.get("request_id"), e.get("replica"), _num(e.get("t"))
        if e.get("event", "generation") != "generation" or not isinstance(rid, str):
            continue
        if rid in counts and isinstance(rep, str) and t is not None:
            pid = e.get("pid") if isinstance(e.get("pid"), int) else None
            out.setdefault(rid, []).append((t, rep, pid))
    for v in out.values():
        v.sort(key=lambda x: x[0])
    return out


def rerun_split(
    records: Iterable[Record],
    ledger: Iterable[Mapping[str, Any]],
    cuts: Sequence[CutAttempt],
    resumed: Mapping[tuple[str, str, int | None], int] | None = None,
) -> dict[str, Any]:
    """Split the drill's multiple generations into the fault's re-runs and the duplicates.

    Per logical request generated ``n`` times, ``k`` of them aborted by the fault (distinct
    aborted generations among ``cuts``): each aborted generation followed by another generation
    of the request started after the cut attempt's send is a re-run; the generations beyond
    the one the request needed among the ``n - k`` others are duplicates (``max(0, n - k - 1)``).

    Args:
        records: the drill's attempt records (their ``request_id`` select ledger lines).
        ledger: the engine's generation ledger lines.
        cuts: the fault-cut attempts (:mod:`chaoslib_infer.measure.faultcut`).
        resumed: the generations a frozen replica went on with after its thaw
            (:func:`frozen_resumed`): their waste is the tokens made after the thaw only.

    Returns:
        ``rerun_generations`` (generations that re-ran one the fault aborted),
        ``rerun_requests`` (logical requests with one), ``fault_cut_generations`` (generations
        the fault aborted), ``fault_wasted_tokens`` (prompt + completion tokens those had spent:
        from the ledger's end lines where the engine wrote them; None, unmeasured, when one did
        not, as a killed process does not), ``fault_wasted_prompt_tokens`` (their prompts'
        tokens, which the re-run prefilled again: from the request's other end lines; None when
        unknown), ``fault_cut_attempts`` (attempts the fault cut, with or without a ledger),
        and the client's and gateway's part: ``duplicate_generations`` (requests with a
        duplicate), ``extra_generations`` (duplicates summed), ``wasted_tokens`` and
        ``wasted_completion_tokens`` (tokens of the duplicates, as
        :func:`chaoslib_infer.measure.retrycost.wasted_tokens`, the aborted generations left
        out and a resumed one's pre-freeze work with them). Ledger figures are None
        (unmeasured) when the ledger holds no ``generation`` line for these requests.
    """
    ids = {str(r["request_id"]) for r in records if r.get("request_id") is not None}
    ledger_list = list(ledger)
    counts = {rid: n for rid, n in generation_counts(ledger_list).items() if rid in ids}
    if not counts:
        return _unmeasured(len(cuts))
    before = resumed or {}
    aborted: dict[str, dict[tuple[str, int | None, float], float]] = {}
    spent: dict[tuple[str, int | None, float], int | None] = {}
    for c in cuts:
        if c.generation_at is None or c.request_id not in counts:
            continue
        key = (c.replica, c.pid, c.generation_at)
        ref = c.sent_at if c.sent_at is not None else c.generation_at
        aborted.setdefault(c.request_id, {})[key] = min(ref, c.generation_at)
        spent[key] = c.spent_tokens
    gens = _gens(ledger_list, counts)
    prompt: dict[str, int] = {}
    dropped = {(rid, rep, pid) for rid, keys in aborted.items() for rep, pid, _ in keys}
    kept: list[Mapping[str, Any]] = []
    for e in ledger_list:
        rid = e.get("request_id")
        if not isinstance(rid, str) or rid not in counts:
            continue
        if e.get("event") == "generation_end":
            pt = e.get("prompt_tokens")
            if isinstance(pt, int):
                prompt.setdefault(rid, pt)
            key3 = (rid, e.get("replica"), e.get("pid"))
            if key3 in dropped:
                continue  # the aborted generation's own end line: the fault's, not a duplicate
            if key3 in before and isinstance(e.get("completion_tokens"), int):
                # a frozen generation resumed after the thaw: only its post-thaw tokens are waste
                pre = before.get((rid, str(e.get("replica")), e.get("pid")), 0)
                after = max(0, int(e["completion_tokens"]) - pre)
                e = {**e, "prompt_tokens": 0, "completion_tokens": after}
        kept.append(e)
    reruns: dict[str, int] = {}
    for rid, keys in aborted.items():
        reruns[rid] = sum(
            1
            for (rep, pid, t0), ref in keys.items()
            if any(
                t >= ref - CLOCK_SLACK_S and (r2, p2, t) != (rep, pid, t0)
                for t, r2, p2 in gens.get(rid, [])
            )
        )
    client = {rid: n - len(aborted.get(rid, {})) for rid, n in counts.items()}
    extra = {rid: max(0, n - 1) for rid, n in client.items()}
    waste = wasted_tokens(kept, {rid: n for rid, n in client.items() if n > 0})
    keys_all = [k for ks in aborted.values() for k in ks]
    fault_spent = [spent[k] for k in keys_all]
    prompts = [prompt.get(rid) for rid, ks in aborted.items() for _ in ks]
    return {
        "rerun_generations": sum(reruns.values()),
        "rerun_requests": sum(1 for n in reruns.values() if n > 0),
        "fault_cut_generations": len(keys_all),
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


def duplicate_causes(
    records: Iterable[Record],
    ledger: Iterable[Mapping[str, Any]],
    cuts: Sequence[CutAttempt],
    resumed: Mapping[tuple[str, str, int | None], int] | None = None,
) -> dict[str, int] | None:
    """Which mechanism each duplicated logical request's own evidence shows (its attempt
    records and the engine ledger), the first that applies of :data:`CAUSES`:

    * ``frozen_resumed``: a frozen replica went on generating it after the thaw, its client
      gone (:func:`frozen_resumed`);
    * ``gateway_resent``: more generations than the client sent attempts (the fault's aborted
      ones left out): the gateway re-sent it while a generation went on;
    * ``client_hedged``: the client sent it again while its earlier attempt was still open;
    * ``client_gave_up``: an attempt ended in a client timeout (``timeout_*``) and the client
      re-sent it, while the engine went on with the generation it left (no fault aborted it);
    * ``stream_failed``: an attempt's stream failed at the client otherwise (reset, truncated,
      5xx) while its generation went on (no fault aborted it), and the client re-sent it;
    * ``unexplained``: none of these shows.

    Returns:
        ``{cause: duplicated requests}`` (causes with none left out); None without a ledger
        line of these requests (unmeasured).
    """
    recs = [r for r in records if r.get("request_id") is not None]
    ids = {str(r["request_id"]) for r in recs}
    ledger_list = list(ledger)
    counts = {rid: n for rid, n in generation_counts(ledger_list).items() if rid in ids}
    if not counts:
        return None
    aborted: dict[str, int] = {}
    for key in {(c.request_id, c.replica, c.pid, c.generation_at) for c in cuts}:
        if key[3] is not None:
            aborted[key[0]] = aborted.get(key[0], 0) + 1
    by_rid: dict[str, list[Record]] = {}
    for r in recs:
        by_rid.setdefault(str(r["request_id"]), []).append(r)
    frozen_ids = {k[0] for k in (resumed or {})}
    cut_attempts = {(c.request_id, c.attempt) for c in cuts}
    out: dict[str, int] = {}
    for rid, n in counts.items():
        mine = n - aborted.get(rid, 0)
        if mine <= 1:
            continue
        attempts = sorted(by_rid.get(rid, []), key=lambda r: int(r.get("attempt") or 1))
        cause = "unexplained"
        if rid in frozen_ids:
            cause = "frozen_resumed"
        elif mine > len(attempts) - aborted.get(rid, 0) and mine > 1:
            cause = "gateway_resent"
        else:
            for prev, nxt in zip(attempts, attempts[1:], strict=False):
                if (rid, int(prev.get("attempt") or 1)) in cut_attempts:
                    continue  # the fault cut it: its re-send is a re-run, not this duplicate
                pe, ns = _num(prev.get("end_at")), _num(nxt.get("sent_at"))
                if pe is not None and ns is not None and pe > ns + CLOCK_SLACK_S:
                    cause = "client_hedged"
                    break
                cls = str(prev.get("error_class") or "")
                if not prev.get("ok") and cls.startswith("timeout"):
                    cause = "client_gave_up"
                    break
                if not prev.get("ok"):
                    cause = "stream_failed"
                    break
        out[cause] = out.get(cause, 0) + 1
    return {c: out[c] for c in CAUSES if c in out}


def generations_after_client_left(
    records: Iterable[Record], ledger: Iterable[Mapping[str, Any]]
) -> int | None:
    """Generations the engine started for a drill's request after every attempt of it had
    ended: the client had left (a hung request the gateway redispatched to a survivor when the
    hang cleared, HAProxy's ``retry-on 503``; a request queued in a frozen replica's socket,
    started at the thaw). Nobody could receive them: the gateway's or the engine's waste, named
    here so it is counted somewhere (not judged).

    Returns:
        The count of ``generation`` lines started more than
        :data:`~chaoslib_infer.measure.faultcut.CLOCK_SLACK_S` after the request's last attempt
        ended; None when the ledger holds no line of these requests (unmeasured).
    """
    left: dict[str, float] = {}
    for r in records:
        rid, end = r.get("request_id"), _num(r.get("end_at"))
        if rid is not None and end is not None:
            left[str(rid)] = max(left.get(str(rid), end), end)
    seen = False
    n = 0
    for e in ledger:
        rid, t = e.get("request_id"), _num(e.get("t"))
        if e.get("event", "generation") != "generation" or str(rid) not in left or t is None:
            continue
        seen = True
        n += t > left[str(rid)] + CLOCK_SLACK_S
    return n if seen else None


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
    lab_events: Iterable[Mapping[str, Any]] = (),
) -> int | None:
    """Logical requests a frozen replica went on generating after it thawed while their client
    had already sent them again: a generation of :func:`frozen_resumed` (``done`` at or after
    the thaw, or ``cancelled`` later than the grace: tokens nobody got) of a request generated
    more than once. Duplicates, counted in ``duplicate_generations`` too. A generation the
    thawed engine ended ``cancelled`` at its first steps (the client gone) is the freeze's cut
    (:func:`chaoslib_infer.measure.faultcut.frozen_cut`), a re-run, not counted here.

    Args:
        records: attempt records (their request ids, ``sent_at``).
        ledger: the engine's generation ledger.
        faults: ``faults.jsonl`` lines (:func:`chaoslib_infer.measure.faultcut.freezes`).
        lab_events: the lab's events (the freeze's ``cleared`` event: its thaw).

    Returns:
        The count; None when the drill froze no replica or the ledger holds no line of these
        requests (unmeasured).
    """
    frozen = freezes(faults, lab_events)
    if not frozen:
        return None
    recs = list(records)
    ids = {str(r["request_id"]) for r in recs if r.get("request_id") is not None}
    ledger_list = [e for e in ledger if str(e.get("request_id")) in ids]
    counts = generation_counts(ledger_list)
    if not counts:
        return None
    cuts = frozen_cut(recs, frozen, ledger_list)
    resumed = frozen_resumed(recs, ledger_list, frozen, cuts)
    return len({rid for rid, _, _ in resumed if counts.get(rid, 0) > 1})


def rerun_figures(
    records: Sequence[Record],
    ledger: Sequence[Mapping[str, Any]],
    faults: Sequence[Mapping[str, Any]],
    lab_events: Sequence[Mapping[str, Any]] = (),
    killed: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The re-run / duplicate figures of one drill on the lab: :func:`rerun_split` over the
    attempts the drill's faults cut (:mod:`chaoslib_infer.measure.faultcut`: the replicas
    ``faults.jsonl`` says were taken or frozen, and the engine's own faults in its ledger),
    plus ``frozen_completed`` (:func:`frozen_completed`) when the drill froze a replica. Also
    ``duplicates`` (= ``duplicate_generations``: the common figure of the same name),
    ``duplicate_causes`` (:func:`duplicate_causes`), ``fault_cut_lost``
    (:func:`fault_cut_lost`) and ``generations_after_client_left``
    (:func:`generations_after_client_left`).

    ``killed``: ``{pod: unix s}`` of the pods a Kubernetes action deleted or OOM-killed
    (:func:`chaoslib_infer.measure.faultcut.taken_pods`): their processes died, so a stream cut
    on one (its ``X-Replica-Id`` in the record's ``replica``) is fault-cut without a ledger."""
    cuts = fault_cut(records, taken_replicas(faults), ledger, lab_events)
    seen = {(c.request_id, c.attempt) for c in cuts}
    if killed:
        more = fault_cut(records, killed, ledger, lab_events, process_died=True)
        cuts += [c for c in more if (c.request_id, c.attempt) not in seen]
        seen = {(c.request_id, c.attempt) for c in cuts}
    frozen = freezes(faults, lab_events)
    for extra in (frozen_cut(records, frozen, ledger), engine_fault_cut(records, ledger)):
        cuts += [c for c in extra if (c.request_id, c.attempt) not in seen]
        seen = {(c.request_id, c.attempt) for c in cuts}
    resumed = frozen_resumed(records, ledger, frozen, cuts) if frozen else {}
    out = rerun_split(records, ledger, cuts, resumed)
    out["duplicates"] = out["duplicate_generations"]
    out["duplicate_causes"] = duplicate_causes(records, ledger, cuts, resumed)
    out["fault_cut_lost"] = fault_cut_lost(records, cuts)
    out["generations_after_client_left"] = generations_after_client_left(records, ledger)
    if out["rerun_generations"] is None and not cuts:  # no ledger: nothing shows an abort
        out["fault_cut_attempts"] = out["fault_cut_lost"] = None
    if frozen or any(f.get("kind") in FREEZE_KINDS for f in faults):
        out["frozen_completed"] = frozen_completed(records, ledger, faults, lab_events)
    return out
