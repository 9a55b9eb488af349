"""Pod selection, simultaneous deletion and krkn-style recovery timings.

Recovery timings follow krkn's pod-recovery figures: for every deleted pod, its replacement (a new
pod, not present before the deletion, owned by the same controller) is paired in creation order,
then timed from the deletion instant:

- ``rescheduling_s``: deletion -> replacement bound to a node (``spec.nodeName`` first seen);
- ``readiness_s``: bound -> condition ``Ready=True`` first seen;
- ``total_recovery_s``: deletion -> Ready.

Times are observed by polling the API (``poll_s``, default 0.25 s), so each is precise to one poll
interval; the API's own condition timestamps have one-second resolution and are kept as
``ready_condition_at`` for cross-checking.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

from chaoslib_infer.platforms.kubernetes import K8sError, call

__all__ = [
    "delete_simultaneously",
    "is_ready",
    "list_pods",
    "owner_uid",
    "read_pod_if_present",
    "recovery_timings",
    "select_pods",
]


def read_pod_if_present(core: Any, namespace: str, pod: str) -> dict[str, Any] | None:
    """The pod ``namespace/pod`` as the API returns it (a dict), or ``None`` when it is gone (404).

    Raises:
        K8sError: any other failure of the GET (403, 5xx, unreachable).
    """
    try:
        return call(f"get pod {namespace}/{pod}", core.read_namespaced_pod, pod, namespace)
    except K8sError as exc:
        if exc.status == 404:
            return None
        raise


def is_ready(pod: dict[str, Any]) -> bool:
    """True when the pod's ``Ready`` condition is ``True`` and it is not being deleted."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def owner_uid(pod: dict[str, Any]) -> str | None:
    """uid of the pod's controller (``ownerReferences[].controller``), None for a bare pod."""
    for ref in pod.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def list_pods(core: Any, namespace: str, selector: str) -> list[dict[str, Any]]:
    """Pods of ``namespace`` matching the label ``selector`` (raw API dicts, sorted by name).

    Raises:
        K8sError: the list call failed (403, unreachable...).
    """
    doc = call(
        f"list pods -l {selector} in namespace {namespace}",
        core.list_namespaced_pod,
        namespace,
        label_selector=selector,
    )
    return sorted(doc.get("items") or [], key=lambda p: p["metadata"]["name"])


def select_pods(
    pods: list[dict[str, Any]], count: int, names: list[str] | None = None
) -> list[dict[str, Any]]:
    """Choose ``count`` Ready pods (the first by name), or exactly ``names``.

    Raises:
        K8sError: fewer Ready pods than asked, or a named pod absent / not Ready.
    """
    ready = [p for p in pods if is_ready(p)]
    if names:
        by_name = {p["metadata"]["name"]: p for p in ready}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise K8sError(
                f"pod(s) {', '.join(missing)} not found among the Ready target pods", 404
            )
        return [by_name[n] for n in names]
    if count < 1:
        raise K8sError(f"count must be >= 1, got {count}")
    if len(ready) < count:
        raise K8sError(
            f"asked for {count} pod(s) but only {len(ready)} of {len(pods)} target pods are Ready",
            404,
        )
    return ready[:count]


def delete_simultaneously(
    core: Any, namespace: str, pods: list[dict[str, Any]], grace_period_s: int = 0
) -> list[dict[str, Any]]:
    """Delete ``pods`` at the same instant: one thread per pod, released together by a barrier.

    Args:
        core: ``CoreV1Api``.
        namespace: their namespace.
        pods: raw pod dicts (from :func:`list_pods`).
        grace_period_s: ``gracePeriodSeconds`` of the deletion (0: SIGKILL at once).

    Returns:
        One entry per pod: ``{"pod", "uid", "node", "owner_uid", "deleted_at" (unix s, request
        sent), "answered_at" (unix s), "error" (None or one line)}``.
    """
    barrier = threading.Barrier(len(pods))
    out: list[dict[str, Any]] = [{} for _ in pods]

    def one(i: int, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        entry = {
            "pod": name,
            "uid": pod["metadata"].get("uid"),
            "node": pod.get("spec", {}).get("nodeName"),
            "owner_uid": owner_uid(pod),
            "error": None,
        }
        try:
            barrier.wait(timeout=10)
        except threading.BrokenBarrierError:
            pass
        entry["deleted_at"] = time.time()
        try:
            call(
                f"delete pod {namespace}/{name}",
                core.delete_namespaced_pod,
                name,
                namespace,
                grace_period_seconds=grace_period_s,
            )
        except K8sError as exc:
            entry["error"] = str(exc)
        entry["answered_at"] = time.time()
        out[i] = entry

    threads = [threading.Thread(target=one, args=(i, p), daemon=True) for i, p in enumerate(pods)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return out


def _condition_at(pod: dict[str, Any], kind: str) -> float | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True" and c.get("lastTransitionTime"):
            try:
                return datetime.fromisoformat(
                    str(c["lastTransitionTime"]).replace("Z", "+00:00")
                ).timestamp()
            except ValueError:
                return None
    return None


def recovery_timings(
    core: Any,
    namespace: str,
    selector: str,
    deleted: list[dict[str, Any]],
    known_uids: set[str],
    timeout_s: float = 120.0,
    poll_s: float = 0.25,
) -> dict[str, Any]:
    """Poll until every deleted pod has a Ready replacement (or ``timeout_s``), krkn-style.

    Args:
        core: ``CoreV1Api``.
        namespace, selector: the target pods.
        deleted: entries from :func:`delete_simultaneously` (or evictions) with ``deleted_at``
            and ``owner_uid``.
        known_uids: uids of every target pod that existed before the deletion (replacements
            are pods not in this set).
        timeout_s: bound on the wait, seconds. poll_s: polling interval, seconds.

    Returns:
        ``{"pods": [{"pod", "replacement", "node", "deleted_at", "scheduled_at", "ready_at",
        "ready_condition_at", "rescheduling_s", "readiness_s", "total_recovery_s", "recovered"}],
        "recovered": int, "unrecovered": [names], "max_total_recovery_s", "polls"}``
        (times unix s; durations s; None where not reached).
    """
    first_seen: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    polls = 0
    rows = [
        dict(d, replacement=None, scheduled_at=None, ready_at=None, ready_condition_at=None)
        for d in deleted
    ]
    while True:
        polls += 1
        now = time.time()
        for pod in list_pods(core, namespace, selector):
            uid = str(pod["metadata"].get("uid"))
            if uid in known_uids:
                continue
            seen = first_seen.setdefault(
                uid,
                {
                    "name": pod["metadata"]["name"],
                    "owner": owner_uid(pod),
                    "created": pod["metadata"].get("creationTimestamp", ""),
                    "order": len(first_seen),
                    "scheduled_at": None,
                    "ready_at": None,
                    "node": None,
                },
            )
            if seen["scheduled_at"] is None and pod.get("spec", {}).get("nodeName"):
                seen["scheduled_at"], seen["node"] = now, pod["spec"]["nodeName"]
            if seen["ready_at"] is None and is_ready(pod):
                seen["ready_at"] = now
                seen["ready_condition_at"] = _condition_at(pod, "Ready")
                if seen["scheduled_at"] is None:
                    seen["scheduled_at"] = now
        # pair deletions with replacements of the same owner, in order
        taken: set[str] = set()
        for row in sorted(rows, key=lambda r: r["deleted_at"]):
            candidates = sorted(
                (
                    s
                    for u, s in first_seen.items()
                    if s["owner"] == row.get("owner_uid") and u not in taken
                ),
                key=lambda s: (s["created"], s["order"]),
            )
            if row["replacement"] is not None:
                match = next((s for s in candidates if s["name"] == row["replacement"]), None)
            else:
                match = candidates[0] if candidates else None
            if match is None:
                continue
            taken.add(next(u for u, s in first_seen.items() if s is match))
            row["replacement"] = match["name"]
            row["node_after"] = match["node"]
            row["scheduled_at"], row["ready_at"] = match["scheduled_at"], match["ready_at"]
            row["ready_condition_at"] = match.get("ready_condition_at")
        if all(r["ready_at"] is not None for r in rows) or time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    for row in rows:
        t0, sched, ready = row["deleted_at"], row["scheduled_at"], row["ready_at"]
        row["rescheduling_s"] = round(sched - t0, 3) if sched is not None else None
        row["readiness_s"] = (
            round(ready - sched, 3) if ready is not None and sched is not None else None
        )
        row["total_recovery_s"] = round(ready - t0, 3) if ready is not None else None
        row["recovered"] = ready is not None
    totals = [r["total_recovery_s"] for r in rows if r["total_recovery_s"] is not None]
    return {
        "pods": rows,
        "recovered": sum(1 for r in rows if r["recovered"]),
        "unrecovered": [r["pod"] for r in rows if not r["recovered"]],
        "max_total_recovery_s": max(totals) if totals else None,
        "polls": polls,
    }
