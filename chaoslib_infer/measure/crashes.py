"""A replica's crashes told whole: exits, exit codes, restarts, restart time, and the trigger.

Ground truth only, from the lab: its ``events.jsonl`` (``exit`` events with ``cause`` and
``status``, e.g. ``exit:70`` or ``oom``, then ``start`` and ``ready``), the engine's ledger
(``generation`` / ``generation_end`` lines with the process id, and a ``fault`` line written by
the sim engine just before a ``crash_on_long_prompt`` kills it, with the prompt's size as the
engine counted it) and, for the restart time, the first request the replica served again
(``served_after``: engine ledger or HAProxy log). The records give the client's count of the
prompt where the ledger has none (``prompt_tokens``, ``prompt_tokens_source``).

**The requests a replica died on** (:func:`died_on`): the request whose ``fault`` line of a crash
mode the dying process wrote, and the generations that process started and never ended (a killed
process writes no ``generation_end``, ``docs/contracts.md`` section 1). Their prompt sizes are the
crash's trigger when the engine dies on its input.

**Restart time** (``docs/definitions.md``, "Drill figures"): from the process's death to the first
request it serves again; unmeasured (None) when it never served again within the data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["CRASH_MODES", "crash_report", "died_on"]

#: engine fault modes whose fault line marks the request the process died on
CRASH_MODES = frozenset({"crash_on_long_prompt"})

Row = Mapping[str, Any]


def _t(e: Row) -> float | None:
    t = e.get("t")
    return float(t) if isinstance(t, int | float) and not isinstance(t, bool) else None


def died_on(ledger: Sequence[Row], exit_event: Row, after: float | None = None) -> list[str]:
    """Request ids the process of ``exit_event`` died on (module docstring), in ledger order.

    The process is matched by its pid; where the ledger holds no line of the replica with that
    pid (a wrapper between the supervisor and the engine), by time: the replica's lines after
    ``after`` (its previous exit) up to this one.

    Args:
        ledger: the engine's ledger lines.
        exit_event: a lab ``exit`` event (``replica``, ``pid``, ``t``).
        after: the replica's previous exit (unix s), for the match by time.
    """
    pid, replica, t = exit_event.get("pid"), exit_event.get("replica"), _t(exit_event)
    if pid and not any(e.get("replica") == replica and e.get("pid") == pid for e in ledger):
        pid = None
    ended = {
        (e.get("request_id"), e.get("pid")) for e in ledger if e.get("event") == "generation_end"
    }
    out: list[str] = []
    for e in ledger:
        if e.get("replica") != replica or (pid and e.get("pid") != pid):
            continue
        te = _t(e)
        if t is not None and te is not None and te > t:
            continue
        if not pid and after is not None and te is not None and te <= after:
            continue
        rid = e.get("request_id")
        crash = e.get("event") == "fault" and e.get("mode") in CRASH_MODES
        cut = e.get("event") == "generation" and (rid, e.get("pid")) not in ended
        if rid and (crash or cut) and rid not in out:
            out.append(str(rid))
    return out


def _prompt(rid: str, ledger: Sequence[Row], records: Mapping[str, Row]) -> dict[str, Any]:
    """``{"request_id", "prompt_tokens", "source"}``: the engine's count from its ledger (the
    crash's fault line, or the ``generation_end`` of the same request served elsewhere, a retry:
    ``"engine"``), else the record's (``"usage"`` | ``"estimate"``), else None."""
    for e in ledger:
        if e.get("request_id") == rid and isinstance(e.get("prompt_tokens"), int):
            return {"request_id": rid, "prompt_tokens": e["prompt_tokens"], "source": "engine"}
    r = records.get(rid) or {}
    n = r.get("prompt_tokens")
    src = r.get("prompt_tokens_source") if isinstance(n, int) else None
    return {"request_id": rid, "prompt_tokens": n if isinstance(n, int) else None, "source": src}


def crash_report(
    lab_events: Iterable[Row],
    ledger: Sequence[Row],
    records: Iterable[Row],
    replicas: Sequence[str],
    since: float,
    served_after: Callable[[str, float], float | None] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Figures and per-exit ground truth of the replicas' exits at or after ``since``.

    Args:
        lab_events: the lab's events (unix seconds).
        ledger: the engine's ledger lines.
        records: attempt records (``prompt_tokens`` where the ledger has no count).
        replicas: the replicas the fault acts on.
        since: exits at or after it count (unix s; the fault's injection, less a clock-skew
            margin where the caller allows one).
        served_after: ``(replica, after) -> unix s | None``: the first request it served after.

    Returns:
        ``(figures, exits)``. Figures: ``replica_exits`` (count), ``replica_restarts`` (exits
        followed by a ``start`` of the replica), ``exit_codes`` (``{cause: count}``, e.g.
        ``{"exit:70": 2}``), ``restart_s`` (worst exit's death to serving again, seconds; None:
        no exit, or one never served again: unmeasured), ``restarts_unserved`` (exits never
        followed by a served request), ``crash_prompt_tokens`` (the prompt sizes of the requests
        the replicas died on, in order), ``crash_prompt_tokens_source`` (``engine`` | ``usage`` |
        ``estimate``, joined when mixed; None without any). Exits: one per exit, ``{"replica",
        "t", "pid", "cause", "status", "restarted_at", "ready_at", "serving_again_at",
        "restart_s", "died_on": [{"request_id", "prompt_tokens", "source"}]}``.
    """
    events = [e for e in lab_events if _t(e) is not None]
    by_id = {str(r.get("request_id")): r for r in records if r.get("request_id")}
    exits: list[dict[str, Any]] = []
    previous: dict[str, float] = {}  # replica -> its last exit seen (for died_on's match by time)
    for e in sorted(events, key=lambda x: _t(x) or 0.0):
        t = _t(e)
        if e.get("event") != "exit" or e.get("replica") not in replicas or t is None:
            continue
        name = str(e["replica"])
        before, previous[name] = previous.get(name), t
        if t < since:
            continue

        def after(kind: str, name: str = name, t: float = t) -> float | None:
            return next(
                (
                    _t(x)
                    for x in events
                    if x.get("event") == kind and x.get("replica") == name and (_t(x) or 0.0) > t
                ),
                None,
            )

        serving = served_after(name, t) if served_after else None
        exits.append({
            "replica": name, "t": t, "pid": e.get("pid"), "cause": e.get("cause"),
            "status": e.get("status"), "restarted_at": after("start"), "ready_at": after("ready"),
            "serving_again_at": serving, "restart_s": None if serving is None else serving - t,
            "died_on": [_prompt(rid, ledger, by_id) for rid in died_on(ledger, e, before)],
        })  # fmt: skip
    codes: dict[str, int] = {}
    for x in exits:
        codes[str(x["cause"])] = codes.get(str(x["cause"]), 0) + 1
    unserved = sum(1 for x in exits if x["restart_s"] is None)
    prompts = [p for x in exits for p in x["died_on"] if p["prompt_tokens"] is not None]
    sources = sorted({str(p["source"]) for p in prompts})
    figures: dict[str, Any] = {
        "replica_exits": len(exits),
        "replica_restarts": sum(1 for x in exits if x["restarted_at"] is not None),
        "exit_codes": codes,
        "restart_s": (
            max(float(x["restart_s"]) for x in exits) if exits and not unserved else None
        ),
        "restarts_unserved": unserved,
        "crash_prompt_tokens": [p["prompt_tokens"] for p in prompts],
        "crash_prompt_tokens_source": "/".join(sources) or None,
    }
    return figures, exits
