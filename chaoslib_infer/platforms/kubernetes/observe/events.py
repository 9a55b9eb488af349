"""Events of the target's namespace, each recorded once (again when its count rose)."""

from __future__ import annotations

from typing import Any

from chaoslib_infer.platforms.kubernetes import call
from chaoslib_infer.platforms.kubernetes.observe.common import (
    SAMPLE_TIMEOUT_S,
    k8s_time,
)
from chaoslib_infer.safety.redact import clip


def list_events(core: Any, namespace: str) -> list[dict[str, Any]]:
    """The core/v1 Events of ``namespace``.

    Raises:
        K8sError: the LIST failed (403: RBAC ``events`` list missing).
    """
    doc = call(
        f"list events in namespace {namespace}",
        core.list_namespaced_event,
        namespace,
        _request_timeout=SAMPLE_TIMEOUT_S,
    )
    return list((doc or {}).get("items") or [])


def _event_count(ev: dict[str, Any]) -> int:
    return int(ev.get("count") or (ev.get("series") or {}).get("count") or 1)


class EventTracker:
    """Deduplicate events by uid; an aggregated event whose count rose is reported again."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def prime(self, items: list[dict[str, Any]]) -> int:
        """Mark ``items`` (the events present at the start) as seen. Returns how many."""
        for ev in items:
            self.counts[str(ev["metadata"].get("uid"))] = _event_count(ev)
        return len(items)

    def new(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Events of ``items`` not seen before, or seen with a lower count.

        Returns:
            Records ``{"uid", "kind", "name", "reason", "type", "message", "first_timestamp",
            "event_time", "last_timestamp", "count", "new"}`` (``new``: occurrences since the
            last sighting), sorted by time.
        """
        out = []
        for ev in items:
            uid = str(ev["metadata"].get("uid"))
            count = _event_count(ev)
            before = self.counts.get(uid)
            if before is not None and count <= before:
                continue
            self.counts[uid] = count
            inv = ev.get("involvedObject") or ev.get("regarding") or {}
            out.append(
                {
                    "uid": uid,
                    "kind": inv.get("kind"),
                    "name": inv.get("name"),
                    "reason": ev.get("reason"),
                    "type": ev.get("type"),
                    "message": clip(str(ev.get("message") or ev.get("note") or ""), 300),
                    "first_timestamp": ev.get("firstTimestamp") or ev.get("eventTime"),
                    "event_time": ev.get("eventTime"),
                    "last_timestamp": ev.get("lastTimestamp")
                    or (ev.get("series") or {}).get("lastObservedTime")
                    or ev.get("eventTime"),
                    "count": count,
                    "new": count - (before or 0),
                }
            )
        out.sort(key=lambda e: (k8s_time(e["last_timestamp"]) or 0.0, e["uid"]))
        return out
