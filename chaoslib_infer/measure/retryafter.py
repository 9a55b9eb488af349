"""How a client and a gateway treated the errors a provider answered: ``Retry-After`` honoured,
final errors retried, retryable ones given up on, and how retries multiplied the load.

Ground truth is the engine ledger (``docs/contracts.md`` section 1), never the client's word: the
``http_error`` fault mode (``lab/engine/errors.py``) writes a ``fault`` line for every request it
answers with an error, with ``answer: {"status", "code", "retryable", "retry_after_s"}``, and the
engine writes a ``generation`` line for every request it serves. So the ledger lists every
arrival of each logical request (``request_id``, kept by every retry: ``X-Request-Id``) at the
engine, whoever re-sent it (the client, its SDK, or the gateway), on the engine's clock.

Definitions (``docs/definitions.md``, "Provider error answers"):

- **Retry-After honoured**: an error answered with ``Retry-After: R`` at engine time *t*, and the
  same request's next arrival at *t'*: honoured when ``t' - t >= R - RETRY_AFTER_TOLERANCE_S``
  (the tolerance covers the engine's own stamping; a client that waits R arrives later, never
  earlier). ``retry_after_honoured_share`` = honoured / retried; None (unmeasured) when no such
  answer was retried at all.
- **Final errors retried** (``retried_final``): errors the provider means as final (a 400 for a
  bad request: ``retryable`` false) after which the same request arrived again.
- **Retryable given up** (``gave_up_retryable``): logical requests whose last arrival was answered
  with a retryable error (429, 503, 500, Ark's ``InvalidEndpoint.ClosedEndpoint``): the client
  stopped while the provider said "try again" (its retry budget, or its policy, e.g. no retry of
  a 400 whatever the code).
- **Load amplification** (``load_amplification``): engine arrivals / logical requests that
  arrived; ``max_arrivals``: the most arrivals of one request (a retry storm multiplies them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["RETRY_AFTER_TOLERANCE_S", "provider_error_figures"]

#: Slack of the Retry-After check, seconds (the engine stamps both arrivals with ``time.time()``
#: after parsing the request; measured jitter on the lab under load is a few ms).
RETRY_AFTER_TOLERANCE_S = 0.05


def _arrivals(
    ledger: Iterable[Mapping[str, Any]], ids: set[str] | None
) -> dict[str, list[tuple[float, dict[str, Any] | None]]]:
    """Per request id, its arrivals at the engine in time order: ``(t, answer)`` (answer None: a
    generation; an ``http_error`` fault line's ``answer`` otherwise)."""
    out: dict[str, list[tuple[float, dict[str, Any] | None]]] = {}
    for e in ledger:
        event, rid, t = e.get("event", "generation"), e.get("request_id"), e.get("t")
        if not isinstance(rid, str) or not isinstance(t, int | float):
            continue
        if ids is not None and rid not in ids:
            continue
        if event == "generation":
            out.setdefault(rid, []).append((float(t), None))
        elif event == "fault" and isinstance(e.get("answer"), dict):
            out.setdefault(rid, []).append((float(t), dict(e["answer"])))
    for seq in out.values():
        seq.sort(key=lambda a: a[0])
    return out


def provider_error_figures(
    ledger: Iterable[Mapping[str, Any]], request_ids: Iterable[str] | None = None
) -> dict[str, Any]:
    """The figures of the module docstring over an engine ledger.

    Args:
        ledger: engine ledger lines (``generation`` and ``fault`` lines are read, others skipped;
            a ``fault`` line without ``answer`` is another fault mode's and is skipped).
        request_ids: the run's logical request ids (other clients' left out); None: all.

    Returns:
        ``{"error_answers", "retry_after_answers", "retry_after_retried",
        "retry_after_honoured", "retry_after_honoured_share" (None: none retried),
        "retry_after_waits_s" (``[[waited, Retry-After], ...]`` in seconds, each retried
        answer), "retried_final", "final_answers", "gave_up_retryable", "requests" (that
        arrived), "arrivals", "load_amplification" (None: no request), "max_arrivals"}``.
    """
    ids = set(request_ids) if request_ids is not None else None
    seqs = _arrivals(ledger, ids)
    errors = ra_answers = ra_retried = ra_ok = final = retried_final = gave_up = 0
    waits: list[list[float]] = []
    for seq in seqs.values():
        for i, (t, ans) in enumerate(seq):
            if ans is None:
                continue
            errors += 1
            nxt = seq[i + 1][0] if i + 1 < len(seq) else None
            if not ans.get("retryable", True):
                final += 1
                retried_final += nxt is not None
            elif nxt is None:
                gave_up += 1
            ra = ans.get("retry_after_s")
            if isinstance(ra, int | float) and ra > 0:
                ra_answers += 1
                if nxt is not None:
                    ra_retried += 1
                    waited = nxt - t
                    waits.append([round(waited, 4), float(ra)])
                    ra_ok += waited >= ra - RETRY_AFTER_TOLERANCE_S
    arrivals = sum(len(s) for s in seqs.values())
    return {
        "error_answers": errors,
        "retry_after_answers": ra_answers,
        "retry_after_retried": ra_retried,
        "retry_after_honoured": ra_ok,
        "retry_after_honoured_share": round(ra_ok / ra_retried, 4) if ra_retried else None,
        "retry_after_waits_s": waits,
        "final_answers": final,
        "retried_final": retried_final,
        "gave_up_retryable": gave_up,
        "requests": len(seqs),
        "arrivals": arrivals,
        "load_amplification": round(arrivals / len(seqs), 4) if seqs else None,
        "max_arrivals": max((len(s) for s in seqs.values()), default=0),
    }
