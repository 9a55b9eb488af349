"""Time series and figures read back from an observation file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaoslib_infer.measure.figkit import json_objects


def read_observations(path: Path) -> list[dict[str, Any]]:
    """The lines of an observation file (unparsable lines, e.g. a torn last one, skipped).

    Returns:
        The JSON objects in file order; ``[]`` when the file does not exist.
    """
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return json_objects(text)


def _samples(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = [x for x in lines if x.get("type") == "sample" and isinstance(x.get("t"), int | float)]
    return sorted(rows, key=lambda x: float(x["t"]))


def _node_windows(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    opened: dict[str, tuple[float, str]] = {}
    out: list[dict[str, Any]] = []
    for s in samples:
        for node, st in sorted((s.get("nodes") or {}).items()):
            ready = str((st or {}).get("ready"))
            if ready != "True" and node not in opened:
                opened[node] = (float(s["t"]), ready)
            elif ready == "True" and node in opened:
                start, state = opened.pop(node)
                out.append(
                    {
                        "node": node,
                        "from": start,
                        "to": float(s["t"]),
                        "state": state,
                        "open": False,
                    }
                )
    last = float(samples[-1]["t"]) if samples else 0.0
    for node, (start, state) in opened.items():
        out.append({"node": node, "from": start, "to": last, "state": state, "open": True})
    return sorted(out, key=lambda w: (w["from"], w["node"]))


def observation_series(lines: list[dict[str, Any]] | Path) -> dict[str, Any]:
    """Time series of an observation (for plots and figures).

    Args:
        lines: the file's lines (:func:`read_observations`) or its path.

    Returns:
        ``{"t": [unix s], "ready": [int | None], "not_ready": [...], "pods_ready": [...],
        "hpa_desired": [...], "restarts": [{"t", "pod", "delta", "restarts", "reason"}],
        "oomkilled": [{"t", "pod"}], "node_windows": [{"node", "from", "to", "state", "open"}],
        "events": [{"t", "reason", "kind", "name", "new"}], "errors": [{"t", "source",
        "error"}]}``. A sample's reads start at its ``t`` and end ``took_s`` later; an event is
        stamped with the end (it existed by then). A restart is an increase of a pod's (same uid) ``restartCount`` between two
        samples, stamped with the later sample's time; an OOM kill is such a restart whose
        ``last_reason`` is ``OOMKilled``, or a pod seen entering the ``OOMKilled`` state.
    """
    rows = _samples(read_observations(lines) if isinstance(lines, Path) else lines)
    out: dict[str, Any] = {
        "t": [],
        "ready": [],
        "not_ready": [],
        "pods_ready": [],
        "hpa_desired": [],
        "restarts": [],
        "oomkilled": [],
        "node_windows": _node_windows(rows),
        "events": [],
        "errors": [],
    }
    prev: dict[str, dict[str, Any]] = {}
    for s in rows:
        t = float(s["t"])
        pods = s.get("pods")
        out["t"].append(t)
        out["ready"].append(s.get("ready"))
        out["not_ready"].append(s.get("not_ready"))
        out["pods_ready"].append(
            sum(1 for st in pods.values() if st.get("ready")) if isinstance(pods, dict) else None
        )
        out["hpa_desired"].append((s.get("hpa") or {}).get("desired"))
        for name, st in sorted((pods or {}).items()):
            key = str(st.get("uid") or name)
            before = prev.get(key)
            restarts = int(st.get("restarts") or 0)
            if before is not None and restarts > before["restarts"]:
                out["restarts"].append(
                    {
                        "t": t,
                        "pod": name,
                        "delta": restarts - before["restarts"],
                        "restarts": restarts,
                        "reason": st.get("last_reason"),
                    }
                )
                if st.get("last_reason") == "OOMKilled" and before.get("reason") != "OOMKilled":
                    out["oomkilled"].append({"t": t, "pod": name})
            elif (
                before is not None
                and st.get("reason") == "OOMKilled"
                and before.get("reason") != "OOMKilled"
            ):
                out["oomkilled"].append({"t": t, "pod": name})
            prev[key] = {"restarts": restarts, "reason": st.get("reason")}
        seen_by = t + float(s.get("took_s") or 0.0)  # the events LIST answered before this
        for ev in s.get("events") or []:
            out["events"].append(
                {
                    "t": seen_by,
                    "reason": ev.get("reason"),
                    "kind": ev.get("kind"),
                    "name": ev.get("name"),
                    "new": int(ev.get("new") or 1),
                }
            )
        for source, err in sorted((s.get("errors") or {}).items()):
            out["errors"].append({"t": t, "source": source, "error": err})
    return out


def observation_figures(path: Path, t0: float) -> dict[str, Any]:
    """Figures of an observation file around the instant ``t0`` (fault injection, spike start).

    Args:
        path: ``k8s-observations.jsonl``.
        t0: unix seconds; the baseline is the last ready count sampled before it (else the first).

    Returns:
        ``{"samples", "interval_s" (median gap), "observed_from", "observed_to" (unix s),
        "baseline_ready", "ready_min", "ready_max" (from ``t0`` on), "below_baseline_s" (sampled
        time from ``t0`` on with fewer ready endpoints than the baseline, precise to one
        interval), "first_below_after_s", "ready_recovered_after_s" (``t0`` to the first sample
        back at the baseline after the last one below it; None if never below, or not back by
        the end), "still_below_at_end" (min, max and time below are None when no sample was
        taken at or after ``t0``: an interval too long for the drill), "restarts" ({pod: restarts during the observation}, pods
        with none left out), "restarts_total", "oomkilled_pods", "node_notready_windows"
        ([{"node", "from_s", "to_s" (relative to ``t0``), "duration_s", "state", "open"}]),
        "node_notready_s" (their total), "events_by_reason" ({reason: occurrences}), "events",
        "hpa_desired_max", "errors" ({source: samples with that read failing})}``; ready figures
        None without a Service. ``{"samples": 0}`` for an empty or missing file.
    """
    lines = read_observations(path)
    rows = _samples(lines)
    if not rows:
        return {"samples": 0}
    series = observation_series(lines)
    ts = series["t"]
    gaps = sorted(b - a for a, b in zip(ts, ts[1:], strict=False))
    figs: dict[str, Any] = {
        "samples": len(rows),
        "interval_s": round(gaps[len(gaps) // 2], 4) if gaps else None,
        "observed_from": ts[0],
        "observed_to": ts[-1],
    }
    pts = [(t, int(r)) for t, r in zip(ts, series["ready"], strict=True) if r is not None]
    baseline = ready_min = ready_max = first_below = recovered = None
    below_s = 0.0
    still_below = False
    if pts:
        before = [r for t, r in pts if t < t0]
        baseline = before[-1] if before else pts[0][1]
        after = [r for t, r in pts if t >= t0]  # none: nothing sampled after t0
        ready_min = min(after) if after else None
        ready_max = max(after) if after else None
        last_below: int | None = None
        for i, (t, r) in enumerate(pts):
            if t < t0 or r >= baseline:
                continue
            last_below = i
            if first_below is None:
                first_below = round(t - t0, 3)
            if i + 1 < len(pts):
                below_s += pts[i + 1][0] - t
        if last_below is not None:
            back = next((t for t, r in pts[last_below + 1 :] if r >= baseline), None)
            recovered = round(back - t0, 3) if back is not None else None
            still_below = back is None
    restarts: dict[str, int] = {}
    for ev in series["restarts"]:
        restarts[ev["pod"]] = restarts.get(ev["pod"], 0) + int(ev["delta"])
    windows = [
        {
            "node": w["node"],
            "from_s": round(w["from"] - t0, 3),
            "to_s": round(w["to"] - t0, 3),
            "duration_s": round(w["to"] - w["from"], 3),
            "state": w["state"],
            "open": w["open"],
        }
        for w in series["node_windows"]
    ]
    by_reason: dict[str, int] = {}
    for ev in series["events"]:
        by_reason[str(ev["reason"])] = by_reason.get(str(ev["reason"]), 0) + int(ev["new"])
    errors: dict[str, int] = {}
    for err in series["errors"]:
        errors[err["source"]] = errors.get(err["source"], 0) + 1
    desired = [d for d in series["hpa_desired"] if d is not None]
    figs.update(
        baseline_ready=baseline,
        ready_min=ready_min,
        ready_max=ready_max,
        below_baseline_s=round(below_s, 3) if pts and ready_min is not None else None,
        first_below_after_s=first_below,
        ready_recovered_after_s=recovered,
        still_below_at_end=still_below,
        restarts=dict(sorted(restarts.items())),
        restarts_total=sum(restarts.values()),
        oomkilled_pods=sorted({o["pod"] for o in series["oomkilled"]}),
        node_notready_windows=windows,
        node_notready_s=round(sum(w["duration_s"] for w in windows), 3),
        events_by_reason=dict(sorted(by_reason.items())),
        events=sum(by_reason.values()),
        hpa_desired_max=max(desired) if desired else None,
        errors=dict(sorted(errors.items())),
    )
    return figs
