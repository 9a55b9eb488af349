"""Figures for what gateways get wrong, measured from the records, the engine ledger and the
gateway's request log (``docs/gateways.md``, "Figures"). Computed for a lab whose gateway is not
HAProxy, and for HAProxy with the user's config (``gateway.json`` ``config_path``; ``{}`` for
HAProxy with the lab's own settings: those labs keep their figures as before).

- ``gateway_timeout_s``: the gateway's *effective* timeout: the longest time it held a client
  request before it answered 5xx or the client gave up on it (nginx ``$request_time`` of the
  5xx and 499 lines; HAProxy ``%Ta`` of its 5xx lines and of those the client or its own
  ``timeout server`` ended (termination state ``C...``/``s...``); LiteLLM, which logs no
  requests: the client's 5xx, 408, stream-error and timed-out attempts, send to end; seconds).
  None when it never did either.
- ``gateway_gave_up``: how many requests it answered 5xx (or lost to the client) that way.
- ``retry_amplification``: upstream generations per client attempt, the largest over the drill's
  logical requests (engine ledger generations of a request id / the client's attempts sent with
  it); above 1.0 the gateway itself re-sent a request that was already generating.
  ``generations_per_attempt``: the same over the whole drill.
- ``gateway_retries``: upstream tries after the first, from the gateway's log (LiteLLM: its
  lanes' lines, per client attempt).
- ``stream_buffering_s``: P50 over attempts of (client first-token receive - engine first-token
  send, from the engine's TTFT log) minus the same gap measured at lab start straight to a
  replica (``gateway.json`` ``direct_first_token_gap_s``); seconds.
- ``routed_to_down``: upstream tries the gateway sent to a replica while it was down (between
  its ``exit`` and its next ``ready`` event in the lab's ground truth).
- ``routed_to_down_late``: those of them sent more than :data:`DOWN_GRACE_S` after the replica
  went down (exited, or froze): time enough for any health check or passive failure count to
  see it (HAProxy's ``inter 500ms fall 2`` marks a dead server DOWN in ~0.8 s, nginx's
  ``max_fails=1`` at the first failed try). Judged (``<= 0``) by the drills that take replicas
  away: a gateway still routing there has no working health check.
- ``streams_cut_200``: attempts that got status 200 and then lost their stream (reset,
  truncated, stream error, empty) by the gateway's doing (its timeouts), judged in every drill.
  ``streams_cut_by_fault``: those the fault itself cut (in flight on a replica it killed or whose
  node it dropped, their generation aborted: :mod:`chaoslib_infer.measure.faultcut`): the
  fault's, not judged by ``streams_cut_200``.
- ``ejection_s`` (upstream-timeout; nginx and LiteLLM only: with the user's HAProxy config the
  drill's own, from HAProxy's ``show stat`` health view, is the gateway's and stays): replaces
  HAProxy's health view, which is not the gateway's: the last time the gateway sent a request to the
  frozen replica, from the freeze (seconds; the hold when it never stopped). A frozen replica counts
  as down for ``routed_to_down``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import chaoslib_infer.lab.gateways.nginx as lab_nginx
from chaoslib_infer.lab.gateways.dispatch import GATEWAY_FILE, describe
from chaoslib_infer.measure.faultcut import fault_cut, taken_replicas
from chaoslib_infer.measure.figkit import json_objects

__all__ = [
    "CUT_CLASSES",
    "DOWN_GRACE_S",
    "TTFT_LOG",
    "calibrate",
    "gateway_figures",
    "haproxy_tries",
    "stream_gaps",
]

TTFT_LOG = "ttft.jsonl"
#: how long after a replica went down (s) a gateway may still route to it before
#: ``routed_to_down_late`` counts the try: its health checks have had time to see it
DOWN_GRACE_S = 2.0
#: error classes of a 200 stream the gateway (or the replica behind it) cut
CUT_CLASSES = frozenset({"reset", "truncated", "stream_error", "empty"})


def _jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return json_objects(text)


def stream_gaps(records: list[dict[str, Any]], ttft: list[dict[str, Any]]) -> list[float]:
    """Per attempt with a first token: client receive time - the engine's send time of that
    request's latest first token at or before it (seconds; unix clocks of one machine)."""
    by_rid: dict[str, list[float]] = {}
    for e in ttft:
        rid, t = e.get("request_id"), e.get("t")
        if isinstance(rid, str) and isinstance(t, int | float):
            by_rid.setdefault(rid, []).append(float(t))
    gaps = []
    for r in records:
        ft, rid = r.get("first_token_at"), r.get("request_id")
        if not isinstance(ft, int | float) or rid not in by_rid:
            continue
        sent = [t for t in by_rid[str(rid)] if t <= float(ft) + 0.005]
        if sent:
            gaps.append(max(0.0, float(ft) - max(sent)))
    return gaps


def _down_windows(events: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    down_since: dict[str, float] = {}
    for ev in sorted(events, key=lambda e: float(e.get("t") or 0)):
        rep, t, kind = ev.get("replica"), float(ev.get("t") or 0), ev.get("event")
        if not isinstance(rep, str):
            continue
        if kind == "exit" and rep not in down_since:
            down_since[rep] = t
        elif kind == "ready" and rep in down_since:
            out.setdefault(rep, []).append((down_since.pop(rep), t))
    for rep, t0 in down_since.items():
        out.setdefault(rep, []).append((t0, float("inf")))
    return out


Try = tuple[float, str, str]  # (unix s the gateway sent it, request id, server name)


def _nginx_tries(
    sd: Path, rids: set[str], lo: float, hi: float
) -> tuple[list[float], list[Try], int]:
    """nginx: held times of its 5xx / 499 lines (s), its upstream tries and its retries (tries
    after the first of each line), from its log."""
    names = lab_nginx.read_servers(sd)
    try:
        lines = (sd / lab_nginx.ACCESS_LOG).read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    held: list[float] = []
    tries: list[Try] = []
    retries = 0
    for line in lines:
        entry = lab_nginx.parse_line(line, names)
        if entry is None or entry.request_id not in rids or not lo <= entry.accept_t <= hi:
            continue
        if entry.status >= 500 or entry.status == 499:
            held.append(entry.ta_ms / 1000.0)
        _, addrs, _ = lab_nginx.upstream_tries(line)
        tries += [(entry.accept_t, str(entry.request_id), names.get(a, a)) for a in addrs]
        retries += max(0, len(addrs) - 1)
    return held, tries, retries


def haproxy_tries(
    sd: Path, rids: set[str], lo: float, hi: float
) -> tuple[list[float], list[Try], int]:
    """HAProxy with the user's config (its request log, :data:`chaoslib_infer.lab.haproxy.
    LOG_FORMAT`): held times (``%Ta``, s) of the requests it answered 5xx, that the client gave
    up on (termination state ``C...``) or that it gave up on itself after a 200 (``s...``: its
    ``timeout server`` mid-stream); its tries (the server that answered, at the time the request
    reached it: HAProxy logs the last server of a request, a retry's earlier one is not named);
    its retries (``%rc``, :func:`chaoslib_infer.lab.requestlog.gateway_retries`)."""
    from chaoslib_infer.lab.requestlog import gateway_retries, parse_request_log
    from chaoslib_infer.lab.statedir import REQUEST_LOG

    entries = [
        e
        for e in parse_request_log(sd / REQUEST_LOG)
        if e.request_id in rids and lo <= e.request_t <= hi
    ]
    held = [
        e.ta_ms / 1000.0
        for e in entries
        if e.status >= 500 or e.term_state[:1] in ("C", "s") or e.status == -1
    ]
    tries: list[Try] = [
        (e.forwarded_t or e.request_t, str(e.request_id), e.server)
        for e in entries
        if e.server != "<NOSRV>"
    ]
    return held, tries, gateway_retries(entries, rids)


def _litellm_tries(
    sd: Path, sent: list[dict[str, Any]], rids: set[str], lo: float, hi: float
) -> tuple[list[float], list[Try], int]:
    """LiteLLM (no request log of its own): held times from the client's records (an attempt
    answered 5xx or 408, LiteLLM's answer to its own timeout; a 200 whose stream ended in an
    error event, how LiteLLM gives up once it has answered; or given up by the client on a
    timeout: end - send, s), its upstream tries
    from the lanes' lines of HAProxy's request log, and its retries: tries after the first
    within one client attempt (a try belongs to the attempt of its request id whose send..end
    holds it)."""
    from chaoslib_infer.lab.requestlog import parse_request_log
    from chaoslib_infer.lab.statedir import REQUEST_LOG

    held = [
        float(r.get("end_at") or r["sent_at"]) - float(r["sent_at"])
        for r in sent
        if (isinstance(r.get("status"), int) and (r["status"] >= 500 or r["status"] == 408))
        or str(r.get("error_class") or "").startswith("timeout")
        or r.get("error_class") == "stream_error"  # a 200, then LiteLLM's own error event
    ]
    tries: list[Try] = [  # request_t: on a keep-alive lane connection %Ts is the previous end
        (e.request_t, str(e.request_id), e.server)
        for e in parse_request_log(sd / REQUEST_LOG)
        if e.request_id in rids and lo <= e.request_t <= hi and e.server != "<NOSRV>"
    ]
    spans: dict[str, list[tuple[float, float]]] = {}
    for r in sent:
        end = float(r.get("end_at") or r["sent_at"])
        spans.setdefault(str(r.get("request_id")), []).append((float(r["sent_at"]), end))
    per_attempt: dict[tuple[str, int], int] = {}
    for t, rid, _ in tries:
        for i, (a, b) in enumerate(spans.get(rid, [])):
            if a - 0.05 <= t <= b:
                per_attempt[(rid, i)] = per_attempt.get((rid, i), 0) + 1
                break
    return held, tries, sum(n - 1 for n in per_attempt.values())


def gateway_figures(lab_dir: Path | str | None, drill_dir: Path | str) -> dict[str, Any]:
    """The gateway figures of one drill (see the module docstring); ``{}`` for HAProxy labs.

    Args:
        lab_dir: the lab's state directory (``gateway.json``, ``gateway-requests.log``,
            ``ledger.jsonl``, ``ttft.jsonl``, ``events.jsonl``), or None.
        drill_dir: the drill's folder (``records.jsonl``).

    Returns:
        ``{"gateway", "gateway_timeout_s", "gateway_gave_up", "retry_amplification",
        "generations_per_attempt", "gateway_retries", "stream_buffering_s", "first_token_gap_p50_s", "routed_to_down", "routed_to_down_late",
        "streams_cut_200", "streams_cut_by_fault"}``; a figure that cannot be measured is None.
    """
    if lab_dir is None:
        return {}
    sd = Path(lab_dir)
    info = describe(sd)
    if info.get("gateway", "haproxy") == "haproxy" and not info.get("config_path"):
        return {}  # the lab's own HAProxy settings: its rows as before
    records = _jsonl(Path(drill_dir) / "records.jsonl")
    sent = [r for r in records if isinstance(r.get("sent_at"), int | float)]
    if not sent:
        return {"gateway": info.get("gateway")}
    lo = min(float(r["sent_at"]) for r in sent) - 0.5
    hi = max(float(r.get("end_at") or r["sent_at"]) for r in sent) + 30.0
    rids = {str(r["request_id"]) for r in sent if r.get("request_id")}
    down = _down_windows(_jsonl(sd / "events.jsonl"))
    frozen_ejection = True
    frozen: list[tuple[str, float, float]] = []
    for f in _jsonl(Path(drill_dir) / "faults.jsonl"):
        if f.get("kind") == "upstream-timeout" and isinstance(f.get("fault_at"), int | float):
            t0 = float(f["fault_at"])
            frozen.append((str(f.get("replica")), t0, t0 + float(f.get("hold_s") or 0)))
    for rep, a, b in frozen:  # a frozen replica is down too
        down.setdefault(rep, []).append((a, b))
    if info.get("gateway") == "litellm":
        held, tries, retries = _litellm_tries(sd, sent, rids, lo, hi)
    elif info.get("gateway", "haproxy") == "haproxy":
        held, tries, retries = haproxy_tries(sd, rids, lo, hi)
        frozen_ejection = False  # HAProxy's own view (show stat) is the gateway's: kept
    else:
        held, tries, retries = _nginx_tries(sd, rids, lo, hi)
    last_to_frozen: dict[tuple[str, float], float] = {}
    routed_down = routed_late = 0
    for t, _, server in tries:
        rep = server.removesuffix("-jitter")
        if any(a <= t <= b for a, b in down.get(rep, [])):
            routed_down += 1
        if any(a + DOWN_GRACE_S < t <= b for a, b in down.get(rep, [])):
            routed_late += 1
        for frep, a, b in frozen:
            if rep == frep and a <= t <= b:
                key = (frep, a)
                last_to_frozen[key] = max(last_to_frozen.get(key, a), t)
    gens: dict[str, int] = {}
    for e in _jsonl(sd / "ledger.jsonl"):
        rid = str(e.get("request_id"))
        if e.get("event", "generation") == "generation" and rid in rids:
            ts = e.get("t")
            if isinstance(ts, int | float) and lo <= float(ts) <= hi:
                gens[rid] = gens.get(rid, 0) + 1
    attempts: dict[str, int] = {}
    for r in sent:
        attempts[str(r.get("request_id"))] = attempts.get(str(r.get("request_id")), 0) + 1
    ratios = [gens[rid] / attempts[rid] for rid in gens if attempts.get(rid)]
    gaps = stream_gaps(sent, _jsonl(sd / TTFT_LOG))
    gap = statistics.median(gaps) if gaps else None
    direct = info.get("direct_first_token_gap_s")
    buffering = None
    if gap is not None:
        buffering = max(0.0, gap - float(direct)) if isinstance(direct, int | float) else gap
    by_fault = _cut_by_fault(sent, Path(drill_dir), sd)
    cut_200 = [
        r
        for r in sent
        if r.get("status") == 200 and not r.get("ok") and r.get("error_class") in CUT_CLASSES
    ]
    cut = sum(1 for r in cut_200 if _key(r) not in by_fault)
    out: dict[str, Any] = {}
    # the gateway's own ejection: it sent nothing more to the frozen replica after
    if frozen and frozen_ejection:
        rep, a, _ = frozen[0]
        out["ejection_s"] = round(last_to_frozen.get((rep, a), a) - a, 3)
        log = "litellm's lanes (HAProxy log)" if info.get("gateway") == "litellm" else None
        log = log or f"{info.get('gateway')} request log"
        out["ejection_source"] = f"{log}: last request sent to {rep}"
    return {
        **out,
        "gateway": info.get("gateway"),
        "gateway_timeout_s": round(max(held), 3) if held else None,
        "gateway_gave_up": len(held),
        "retry_amplification": round(max(ratios), 4) if ratios else None,
        "generations_per_attempt": round(sum(gens.values()) / len(sent), 4),
        "gateway_retries": retries,
        "stream_buffering_s": round(buffering, 4) if buffering is not None else None,
        "first_token_gap_p50_s": round(gap, 4) if gap is not None else None,
        "routed_to_down": routed_down,
        "routed_to_down_late": routed_late,
        "streams_cut_200": cut,
        "streams_cut_by_fault": sum(1 for r in cut_200 if _key(r) in by_fault),
    }


def _key(r: dict[str, Any]) -> tuple[str, int]:
    return str(r.get("request_id")), int(r.get("attempt") or 1)


def _cut_by_fault(sent: list[dict[str, Any]], drill_dir: Path, sd: Path) -> set[tuple[str, int]]:
    """``{(request id, attempt)}`` of the attempts the fault itself cut (a killed replica, a
    dropped node: :func:`chaoslib_infer.measure.faultcut.fault_cut` over the drill's
    ``faults.jsonl``, the lab's ledger and events): not the gateway's cut."""
    cuts = fault_cut(
        sent,
        taken_replicas(_jsonl(drill_dir / "faults.jsonl")),
        _jsonl(sd / "ledger.jsonl"),
        _jsonl(sd / "events.jsonl"),
    )
    return {(c.request_id, c.attempt) for c in cuts}


def calibrate(state_dir: Path, host: str, port: int, n: int = 5) -> float | None:
    """The first-token gap without the gateway: ``n`` short streams sent straight to one
    replica (``host:port``), each gap = the client's first content chunk - the engine's
    first-token send (its TTFT log); the median is stored in ``gateway.json`` as
    ``direct_first_token_gap_s`` (seconds) and returned. None when nothing was measured
    (no TTFT log, a replica that did not answer); never raises for those.
    """
    import http.client
    import time

    sd = Path(state_dir)
    records: list[dict[str, Any]] = []
    body = json.dumps(
        {
            "model": "m",
            "stream": True,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "x"}],
        }
    )
    for i in range(n):
        rid = f"gateway-calibration-{i}-{time.time_ns()}"
        try:
            conn = http.client.HTTPConnection(host, port, timeout=5)
            conn.request(
                "POST",
                "/v1/chat/completions",
                body,
                {"Content-Type": "application/json", "X-Request-Id": rid},
            )
            resp = conn.getresponse()
            while True:
                line = resp.fp.readline()
                if not line:
                    break
                if b'"content"' in line:
                    records.append({"request_id": rid, "first_token_at": time.time()})
                    break
            conn.close()
        except (OSError, http.client.HTTPException):
            continue
    time.sleep(0.05)
    gaps = stream_gaps(records, _jsonl(sd / TTFT_LOG))
    value = round(sorted(gaps)[len(gaps) // 2], 4) if gaps else None
    info = describe(sd)
    info["direct_first_token_gap_s"] = value
    (sd / GATEWAY_FILE).write_text(json.dumps(info, indent=1))
    return value
