"""The traffic-spike wait: poll until new pods serve (when the HPA rose, pods were made, ready)."""

from __future__ import annotations

import math
import time
from typing import Any

from chaoslib_infer.platforms.kubernetes import K8sError
from chaoslib_infer.platforms.kubernetes.observe.common import (
    Apis,
    k8s_time,
)
from chaoslib_infer.platforms.kubernetes.observe.endpoints import list_endpoints
from chaoslib_infer.platforms.kubernetes.observe.hpa import find_hpa, hpa_state
from chaoslib_infer.platforms.kubernetes.observe.pods import list_target_pods
from chaoslib_infer.platforms.kubernetes.pods import is_ready
from chaoslib_infer.platforms.kubernetes.target import K8sTarget


def wait_scale_out(
    api_client: Any,
    target: K8sTarget,
    spike_at: float,
    min_new_ready: int = 1,
    timeout_s: float = 300.0,
    poll_s: float = 1.0,
) -> dict[str, Any]:
    """Poll the target until ``min_new_ready`` new pods have a ready endpoint (or ``timeout_s``).

    A pod is *new* when it was absent at the first poll, or its ``creationTimestamp`` (one-second
    resolution, truncated) is at or after ``spike_at``: a pod created in the spike's own second
    before the call counts as old (the safe side: never a pre-spike pod taken for scale-out). Instants are the poll
    at which a fact was first seen (precise to ``poll_s``); facts already true at the first poll
    take the API's own timestamp instead (``creationTimestamp``, the Ready condition's
    ``lastTransitionTime``, HPA ``lastScaleTime``) or, for an endpoint already serving, the call
    time (an upper bound); ``sources`` says which.

    Args:
        api_client: ``kubernetes.client.ApiClient``.
        target: the target (needs ``service``; ``hpa``/``deployment`` to find the HPA).
        spike_at: unix seconds of the spike start; every ``*_at_s`` figure is relative to it.
        min_new_ready: new ready endpoints to wait for.
        timeout_s: bound on the wait, seconds. poll_s: polling interval, seconds.

    Returns:
        ``{"kind": "k8s-scale-out", "spike_at", "called_at", "hpa", "hpa_desired_before",
        "hpa_desired_after", "hpa_current_after", "ready_before", "ready_after", "min_new_ready",
        "new_ready", "hpa_desired_at_s", "pod_created_at_s", "ready_at_s", "serving_at_s" (first
        new pod's endpoint ready: it can receive traffic), "completed_at_s" (the
        ``min_new_ready``-th), "new_pods": [{"pod", "node", "phase", "created_at", "ready_at",
        "serving_at"}], "hpa_error" (why no HPA was looked at, e.g. a 403 on listing HPAs when
        the target names none; None), "sources", "polls", "timed_out"}`` (unix s; ``*_s`` relative to
        ``spike_at``; None where not reached).

    Raises:
        K8sError: no ``service:`` in the target, or an API call failed (403, 404...).
    """
    if not target.service:
        raise K8sError(
            f"{target.source}: no 'service:' (the Service whose EndpointSlices show when a new "
            "pod can receive traffic); add it to the target file"
        )
    a = Apis(api_client)
    ns, svc = target.namespace, target.service
    called = time.time()
    hpa_error = None
    try:
        hpa = find_hpa(a.autoscaling, target)
    except K8sError as exc:
        if target.hpa:  # named in the target: it must be readable
            raise
        hpa, hpa_error = None, str(exc)  # the HPA figures are optional
    hpa0 = hpa_state(a.autoscaling, ns, hpa) if hpa else None
    pods0 = list_target_pods(a.core, target)
    eps0 = list_endpoints(a.discovery, ns, svc)
    cutoff = spike_at if spike_at <= called else math.inf
    old_uids = {
        str(p["metadata"].get("uid"))
        for p in pods0
        if (k8s_time(p["metadata"].get("creationTimestamp")) or 0.0) < cutoff
    }
    sources: dict[str, str | None] = {}
    desired0 = (hpa0 or {}).get("desired")
    hpa_rose_at: float | None = None
    if hpa0 is not None and desired0 is not None:
        last_scale = k8s_time(hpa0.get("last_scale_time"))
        if last_scale is not None and math.floor(spike_at) <= last_scale and spike_at <= called:
            hpa_rose_at, sources["hpa_desired_at_s"] = last_scale, "lastScaleTime"
    seen: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + float(timeout_s)
    polls = 0
    pods, eps, h = pods0, eps0, hpa0
    while True:
        first = polls == 0
        now = called if first else time.time()
        if not first:
            pods = list_target_pods(a.core, target)
            eps = list_endpoints(a.discovery, ns, svc)
            h = hpa_state(a.autoscaling, ns, hpa) if hpa else None
        polls += 1
        if (
            h is not None
            and hpa_rose_at is None
            and desired0 is not None
            and (h.get("desired") or 0) > desired0
        ):
            hpa_rose_at, sources["hpa_desired_at_s"] = now, "poll"
        serving = {e["pod"] for e in eps["ready"] if e["pod"]}
        for p in pods:
            uid = str(p["metadata"].get("uid"))
            if uid in old_uids:
                continue
            name = p["metadata"]["name"]
            row = seen.get(uid)
            if row is None:
                created = k8s_time(p["metadata"].get("creationTimestamp")) if first else now
                row = seen[uid] = {
                    "pod": name,
                    "created_at": created,
                    "created_src": "creationTimestamp" if first else "poll",
                    "ready_at": None,
                    "serving_at": None,
                }
            row["node"] = (p.get("spec") or {}).get("nodeName")
            row["phase"] = (p.get("status") or {}).get("phase")
            if row["ready_at"] is None and is_ready(p):
                cond: dict[str, Any] = next(
                    (
                        c
                        for c in (p.get("status") or {}).get("conditions") or []
                        if c.get("type") == "Ready"
                    ),
                    {},
                )
                api_at = k8s_time(cond.get("lastTransitionTime"))
                use_api = first and api_at is not None
                row["ready_at"] = api_at if use_api else now
                row["ready_src"] = "condition" if use_api else "poll"
            if row["serving_at"] is None and name in serving:
                row["serving_at"] = now
                row["serving_src"] = "call time (already serving)" if first else "poll"
        done = sorted(r["serving_at"] for r in seen.values() if r["serving_at"] is not None)
        if len(done) >= min_new_ready or time.monotonic() >= deadline:
            break
        time.sleep(max(0.0, min(float(poll_s), deadline - time.monotonic())))

    def first_of(key: str) -> tuple[float | None, str | None]:
        rows = [r for r in seen.values() if r[key] is not None]
        if not rows:
            return None, None
        r = min(rows, key=lambda x: x[key])
        return r[key], r.get(key.replace("_at", "_src"))

    def rel(x: float | None) -> float | None:
        return round(x - spike_at, 3) if x is not None else None

    created_at, sources["pod_created_at_s"] = first_of("created_at")
    ready_at, sources["ready_at_s"] = first_of("ready_at")
    serving_at, sources["serving_at_s"] = first_of("serving_at")
    return {
        "kind": "k8s-scale-out",
        "spike_at": spike_at,
        "called_at": called,
        "hpa": hpa,
        "hpa_desired_before": desired0,
        "hpa_desired_after": (h or {}).get("desired"),
        "hpa_current_after": (h or {}).get("current"),
        "ready_before": len(eps0["ready"]),
        "ready_after": len(eps["ready"]),
        "min_new_ready": min_new_ready,
        "new_ready": len(done),
        "hpa_desired_at_s": rel(hpa_rose_at),
        "pod_created_at_s": rel(created_at),
        "ready_at_s": rel(ready_at),
        "serving_at_s": rel(serving_at),
        "completed_at_s": rel(done[min_new_ready - 1]) if len(done) >= min_new_ready else None,
        "new_pods": [
            {
                "pod": r["pod"],
                "node": r.get("node"),
                "phase": r.get("phase"),
                "created_at": r["created_at"],
                "ready_at": r["ready_at"],
                "serving_at": r["serving_at"],
            }
            for r in sorted(seen.values(), key=lambda x: (x["created_at"] or 0.0, x["pod"]))
        ],
        "hpa_error": hpa_error,
        "sources": {k: v for k, v in sources.items() if v is not None},
        "polls": polls,
        "timed_out": len(done) < min_new_ready,
    }
