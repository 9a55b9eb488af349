"""The background sampler writing ``k8s-observations.jsonl``, and the registry of running ones."""

from __future__ import annotations

import atexit
import json
import threading
import time
from pathlib import Path
from typing import IO, Any

from chaoslib_infer.platforms.kubernetes import K8sError
from chaoslib_infer.platforms.kubernetes.observe.common import (
    DEFAULT_MAX_DURATION_S,
    Apis,
)
from chaoslib_infer.platforms.kubernetes.observe.endpoints import list_endpoints
from chaoslib_infer.platforms.kubernetes.observe.events import EventTracker, list_events
from chaoslib_infer.platforms.kubernetes.observe.hpa import find_hpa, hpa_state
from chaoslib_infer.platforms.kubernetes.observe.nodes import node_state
from chaoslib_infer.platforms.kubernetes.observe.pods import list_target_pods, pod_state
from chaoslib_infer.platforms.kubernetes.target import K8sTarget

#: Longest a stop waits for the sampler thread, seconds (one request's worst case, plus margin).
STOP_JOIN_S = 15.0


_RUNNING: dict[str, Sampler] = {}
_LOCK = threading.Lock()


class Sampler:
    """Background sampler of one target into ``path`` (file format: the package docstring).

    Use :meth:`start` (first sample taken synchronously, then a daemon thread every
    ``interval_s``), :meth:`stop` (idempotent; one last sample first, the end state). The thread
    stops by itself after ``max_duration_s`` and at interpreter exit (:func:`stop_all` is
    registered with ``atexit``).
    """

    def __init__(
        self,
        api_client: Any,
        target: K8sTarget,
        path: Path,
        interval_s: float = 1.0,
        max_duration_s: float = DEFAULT_MAX_DURATION_S,
    ) -> None:
        self.apis = Apis(api_client)
        self.target = target
        self.path = path
        self.interval_s = float(interval_s)
        self.max_duration_s = float(max_duration_s)
        self.samples = 0
        self.errors: dict[str, int] = {}
        self.hpa: str | None = None
        self.nodes: set[str] = set()
        self.events = EventTracker()
        self.started_at: float | None = None
        self.stop_reason: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fh: IO[str] | None = None

    # one sample --------------------------------------------------------------------------------
    def _try(self, source: str, errors: dict[str, str], fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except K8sError as exc:
            errors[source] = str(exc)
            self.errors[source] = self.errors.get(source, 0) + 1
            return None

    def sample(self, strict: bool = False) -> dict[str, Any]:
        """Read everything once.

        Args:
            strict: raise when the pods cannot be listed (the first sample: nothing to observe).

        Returns:
            A ``{"type": "sample", ...}`` line (see the package docstring); failed reads are null
            and their one-line error is in ``errors``.

        Raises:
            K8sError: ``strict`` and the pod LIST failed.
        """
        t = time.time()
        t0 = time.monotonic()
        errors: dict[str, str] = {}
        a, tg = self.apis, self.target
        if strict:
            pods_raw = list_target_pods(a.core, tg)
        else:
            pods_raw = self._try("pods", errors, list_target_pods, a.core, tg)
        pods = None
        if pods_raw is not None:
            pods = {p["metadata"]["name"]: pod_state(p, tg.container) for p in pods_raw}
            self.nodes.update(s["node"] for s in pods.values() if s["node"])
        eps = None
        if tg.service:
            eps = self._try(
                "endpointslices", errors, list_endpoints, a.discovery, tg.namespace, tg.service
            )
        nodes: dict[str, Any] = {}
        for name in sorted(self.nodes):
            state = self._try("nodes", errors, node_state, a.core, name)
            if state is not None:
                nodes[name] = state
        hpa = (
            self._try("hpa", errors, hpa_state, a.autoscaling, tg.namespace, self.hpa)
            if self.hpa
            else None
        )
        raw_events = self._try("events", errors, list_events, a.core, tg.namespace)
        events = self.events.new(raw_events) if raw_events is not None else []
        self.samples += 1
        return {
            "type": "sample",
            "t": t,
            "took_s": round(time.monotonic() - t0, 4),
            "ready": len(eps["ready"]) if eps is not None else None,
            "not_ready": len(eps["not_ready"]) if eps is not None else None,
            "endpoints": eps,
            "pods": pods,
            "nodes": nodes,
            "hpa": hpa,
            "events": events,
            "errors": errors,
        }

    # lifecycle --------------------------------------------------------------------------------
    def _write(self, line: dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(line) + "\n")
            self._fh.flush()

    def start(self) -> dict[str, Any]:
        """Prime the event history, take the first sample, open the file and start the thread.

        Returns:
            The first sample line.

        Raises:
            K8sError: the pods cannot be listed, or the named HPA is absent/forbidden (nothing
                written, no thread started).
        """
        a, tg = self.apis, self.target
        hpa_error = None
        try:
            self.hpa = find_hpa(a.autoscaling, tg)
        except K8sError as exc:
            if tg.hpa:  # named in the target: it must be readable
                raise
            hpa_error = str(exc)  # looking for the Deployment's HPA is optional
        try:
            self.events.prime(list_events(a.core, tg.namespace))
        except K8sError:
            pass  # reported by the first sample's "events" error
        first = self.sample(strict=True)
        if hpa_error is not None:
            first["errors"]["hpa"] = hpa_error
            self.errors["hpa"] = self.errors.get("hpa", 0) + 1
        self.started_at = first["t"]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")
        self._write(
            {
                "type": "start",
                "t": first["t"],
                "namespace": tg.namespace,
                "selector": tg.selector,
                "container": tg.container,
                "service": tg.service,
                "hpa": self.hpa,
                "interval_s": self.interval_s,
                "max_duration_s": self.max_duration_s,
            }
        )
        self._write(first)
        self._thread = threading.Thread(
            target=self._run, name=f"k8s-observe:{self.path.parent.name}", daemon=True
        )
        with _LOCK:
            _RUNNING[str(self.path)] = self
        self._thread.start()
        return first

    def _run(self) -> None:
        reason = "max_duration"
        deadline = time.monotonic() + self.max_duration_s
        next_at = time.monotonic() + self.interval_s
        try:
            while True:
                if self._stop.wait(max(0.0, min(next_at, deadline) - time.monotonic())):
                    reason = self.stop_reason or "stopped"
                    if reason == "stopped":  # the rollback: one last sample, the end state
                        self._write(self.sample())
                    break
                if time.monotonic() >= deadline:
                    break
                next_at = max(next_at + self.interval_s, time.monotonic())
                self._write(self.sample())
        except Exception as exc:  # never die silently: the stop line says why
            reason = f"sampler failed: {type(exc).__name__}: {exc}"
        finally:
            try:
                self._write(
                    {"type": "stop", "t": time.time(), "reason": reason, "samples": self.samples}
                )
                if self._fh is not None:
                    self._fh.close()
            except OSError:  # the file went away (disk full, folder removed): nothing to flush
                pass
            self._fh = None
            self.stop_reason = reason
            with _LOCK:
                if _RUNNING.get(str(self.path)) is self:
                    del _RUNNING[str(self.path)]
            self.apis.api_client.close()

    @property
    def alive(self) -> bool:
        """Whether the sampler thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, reason: str = "stopped", timeout_s: float = STOP_JOIN_S) -> dict[str, Any]:
        """Stop the thread and wait for it to write its stop line (idempotent). With the
        default ``reason`` ("stopped": the rollback) it takes one last sample first.

        Returns:
            ``{"path", "samples", "errors": {source: failed reads}, "reason", "stopped" (False:
            the thread is still in a request after ``timeout_s``; it ends after that request)}``.
        """
        if self.stop_reason is None:
            self.stop_reason = reason
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        return {
            "path": str(self.path),
            "samples": self.samples,
            "errors": dict(self.errors),
            "reason": self.stop_reason,
            "stopped": not self.alive,
        }


def running_sampler(path: Path) -> Sampler | None:
    """The sampler writing ``path`` in this process, if one is running."""
    with _LOCK:
        return _RUNNING.get(str(path))


def stop_all(reason: str = "interpreter exit", timeout_s: float = 5.0) -> int:
    """Stop every sampler of this process (registered with ``atexit``). Returns how many."""
    with _LOCK:
        samplers = list(_RUNNING.values())
    for s in samplers:
        s.stop(reason, timeout_s)
    return len(samplers)


atexit.register(stop_all)
