"""Observe a Kubernetes target during a drill: endpoints, restarts, OOM kills, nodes, events, HPA.

What is read (raw API dicts through :func:`~chaoslib_infer.platforms.kubernetes.call`):

- **ready endpoints**: the target Service's ``discovery.k8s.io/v1`` EndpointSlices (label
  ``kubernetes.io/service-name=<service>``). An endpoint counts as ready when
  ``conditions.ready`` is true or absent (the API's "unknown: treat as ready") and it is not
  terminating; endpoints are counted once per pod (``targetRef``), else per address, so
  dual-stack slices or a Service split over several slices do not count a pod twice. A ready
  endpoint is what kube-proxy / the gateway sends traffic to: the "serving" instant.
- **pods** (label selector of the target): phase, Ready, ``restartCount``,
  ``lastState.terminated.reason`` (``OOMKilled``), current waiting/terminated reason, node; of the
  target ``container`` (the first container when the pod has none of that name).
- **nodes** of those pods (every node a target pod ran on since the observation started): the
  ``Ready`` condition (``True``/``False``/``Unknown``, ``absent`` once the Node object is gone) and
  ``spec.unschedulable``; one GET per node, so the cost follows the pod count, not the cluster's.
- **events** of the namespace (core/v1, which also serves events written through
  ``events.k8s.io/v1``: ``eventTime`` set, ``firstTimestamp`` null): kept once per uid; an
  aggregated event whose ``count`` (or ``series.count``) rose is recorded again with ``new`` =
  the increase. Events already present when the observation starts are history: not recorded.
- **HPA** (``autoscaling/v2``; KEDA's ``keda-hpa-<ScaledObject>`` is one): the target's ``hpa:``,
  else the HPA whose ``scaleTargetRef`` is the target's Deployment; desired/current replicas.

LIST polling, not WATCH: one LIST per object kind per interval is bounded (4 requests/s plus one
GET per node at the default 1 s), needs no resourceVersion bookkeeping, no reconnect after a watch
expires (410 Gone) or an API server restart, and samples *state* at a known instant, which is what a
timeline of ready counts needs; events are read the same way and deduplicated by uid. Each
request has a (3 s connect, 10 s read) timeout, so a stop waits at most that long.

File ``<run dir>/k8s-observations.jsonl`` (unix seconds, one JSON object a line, flushed each line):
``{"type": "start", "t", "namespace", "selector", "container", "service", "hpa", "interval_s",
"max_duration_s"}``, then ``{"type": "sample", "t", "took_s", "ready", "not_ready", "endpoints":
{"ready": [{"pod", "ip", "node"}], "not_ready": [...]}, "pods": {name: {"uid", "phase", "ready",
"restarts", "last_reason", "reason", "node"}}, "nodes": {name: {"ready", "unschedulable"}},
"hpa": {"name", "desired", "current", "min", "max", "last_scale_time"} | null, "events":
[{"uid", "kind", "name", "reason", "type", "message", "first_timestamp", "event_time",
"last_timestamp", "count", "new"}], "errors": {source: one line}}`` (``ready``/``endpoints`` null
without a Service or when the slices could not be read), and last ``{"type": "stop", "t",
"reason", "samples"}``.
"""

from __future__ import annotations

import atexit
import json
import math
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from chaoslib_infer.platforms.kubernetes import K8sError, call
from chaoslib_infer.platforms.kubernetes.pods import is_ready
from chaoslib_infer.platforms.kubernetes.target import K8sTarget
from chaoslib_infer.safety.redact import clip

__all__ = [
    "DEFAULT_MAX_DURATION_S",
    "OBSERVATIONS_FILE",
    "EventTracker",
    "Sampler",
    "container_status",
    "find_hpa",
    "hpa_state",
    "list_endpoints",
    "list_events",
    "list_target_pods",
    "node_state",
    "observation_figures",
    "observation_series",
    "pod_state",
    "read_observations",
    "running_sampler",
    "stop_all",
    "wait_scale_out",
]

#: File name of the sampler's output, in the run directory.
OBSERVATIONS_FILE = "k8s-observations.jsonl"
#: The sampler stops by itself after this many seconds (1 h).
DEFAULT_MAX_DURATION_S = 3600.0
#: (connect, read) timeout of each observation request, seconds.
SAMPLE_TIMEOUT_S = (3.0, 10.0)
#: Longest a stop waits for the sampler thread, seconds (one request's worst case, plus margin).
STOP_JOIN_S = 15.0


def _ts(value: Any) -> float | None:
    """A Kubernetes timestamp (RFC 3339, second or microsecond resolution) as unix seconds."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# -- one read of each kind ------------------------------------------------------------------------


def _endpoint_key(ep: dict[str, Any]) -> str:
    ref = ep.get("targetRef") or {}
    if ref.get("name"):
        return f"{ref.get('kind', 'Pod')}/{ref['name']}"
    return ",".join(ep.get("addresses") or []) or "?"


def list_endpoints(discovery: Any, namespace: str, service: str) -> dict[str, list[dict[str, Any]]]:
    """Ready and not-ready endpoints of ``service`` from its EndpointSlices.

    Args:
        discovery: ``kubernetes.client.DiscoveryV1Api``.
        namespace: the Service's namespace. service: its name.

    Returns:
        ``{"ready": [{"pod", "ip", "node"}], "not_ready": [...]}``, each sorted, one entry per pod
        (``pod`` None for an endpoint without a Pod ``targetRef``). Ready: ``conditions.ready``
        true or absent, and not ``terminating``. A pod listed ready in one slice and not ready in
        another (a slice not yet updated) counts as ready.

    Raises:
        K8sError: the LIST failed (403: RBAC ``endpointslices`` list missing).
    """
    doc = call(
        f"list endpointslices of service {namespace}/{service}",
        discovery.list_namespaced_endpoint_slice,
        namespace,
        label_selector=f"kubernetes.io/service-name={service}",
        _request_timeout=SAMPLE_TIMEOUT_S,
    )
    ready: dict[str, dict[str, Any]] = {}
    not_ready: dict[str, dict[str, Any]] = {}
    for sl in (doc or {}).get("items") or []:
        for ep in sl.get("endpoints") or []:
            cond = ep.get("conditions") or {}
            ok = cond.get("ready") is not False and not cond.get("terminating")
            ref = ep.get("targetRef") or {}
            entry = {
                "pod": ref.get("name") if ref.get("kind", "Pod") == "Pod" else None,
                "ip": (ep.get("addresses") or [None])[0],
                "node": ep.get("nodeName"),
            }
            key = _endpoint_key(ep)
            if ok:
                ready[key] = entry
                not_ready.pop(key, None)
            elif key not in ready:
                not_ready[key] = entry
    return {
        "ready": [ready[k] for k in sorted(ready)],
        "not_ready": [not_ready[k] for k in sorted(not_ready)],
    }


def container_status(pod: dict[str, Any], container: str) -> dict[str, Any] | None:
    """The ``containerStatuses`` entry of ``container`` (the first one when none has that name)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for cs in statuses:
        if cs.get("name") == container:
            return dict(cs)
    return dict(statuses[0]) if statuses else None


def pod_state(pod: dict[str, Any], container: str) -> dict[str, Any]:
    """What the sampler keeps of one pod.

    Returns:
        ``{"uid", "phase", "ready" (bool), "restarts" (restartCount of ``container``),
        "last_reason" (lastState.terminated.reason: OOMKilled, Error... or None), "reason" (the
        current waiting/terminated reason: CrashLoopBackOff, OOMKilled... or None), "node"}``.
    """
    cs = container_status(pod, container) or {}
    state = cs.get("state") or {}
    current = state.get("waiting") or state.get("terminated") or {}
    return {
        "uid": pod["metadata"].get("uid"),
        "phase": (pod.get("status") or {}).get("phase"),
        "ready": is_ready(pod),
        "restarts": int(cs.get("restartCount") or 0),
        "last_reason": ((cs.get("lastState") or {}).get("terminated") or {}).get("reason"),
        "reason": current.get("reason"),
        "node": (pod.get("spec") or {}).get("nodeName"),
    }


def list_target_pods(core: Any, target: K8sTarget) -> list[dict[str, Any]]:
    """The target pods (raw dicts, sorted by name), with the observation timeout.

    Raises:
        K8sError: the LIST failed.
    """
    doc = call(
        f"list pods -l {target.selector} in namespace {target.namespace}",
        core.list_namespaced_pod,
        target.namespace,
        label_selector=target.selector,
        _request_timeout=SAMPLE_TIMEOUT_S,
    )
    return sorted((doc or {}).get("items") or [], key=lambda p: p["metadata"]["name"])


def node_state(core: Any, name: str) -> dict[str, Any]:
    """``{"ready": "True" | "False" | "Unknown" | "absent", "unschedulable": bool}`` of a node.

    Raises:
        K8sError: the GET failed with anything but 404 (absent).
    """
    try:
        doc = call(f"get node {name}", core.read_node, name, _request_timeout=SAMPLE_TIMEOUT_S)
    except K8sError as exc:
        if exc.status == 404:
            return {"ready": "absent", "unschedulable": False}
        raise
    ready = next(
        (
            str(c.get("status"))
            for c in (doc.get("status") or {}).get("conditions") or []
            if c.get("type") == "Ready"
        ),
        "Unknown",
    )
    return {"ready": ready, "unschedulable": bool((doc.get("spec") or {}).get("unschedulable"))}


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
        out.sort(key=lambda e: (_ts(e["last_timestamp"]) or 0.0, e["uid"]))
        return out


def find_hpa(autoscaling: Any, target: K8sTarget) -> str | None:
    """The HPA to watch: the target's ``hpa:`` (must exist), else the HPA of its Deployment.

    Args:
        autoscaling: ``kubernetes.client.AutoscalingV2Api``.
        target: the target (``hpa``, ``deployment``, ``namespace``).

    Returns:
        The HPA name, or None (no ``hpa:``, and no HPA's ``scaleTargetRef`` is the Deployment).

    Raises:
        K8sError: the named HPA is absent (404) or a call was refused (403).
    """
    ns = target.namespace
    if target.hpa:
        call(
            f"get horizontalpodautoscaler {ns}/{target.hpa}",
            autoscaling.read_namespaced_horizontal_pod_autoscaler,
            target.hpa,
            ns,
            _request_timeout=SAMPLE_TIMEOUT_S,
        )
        return target.hpa
    if not target.deployment:
        return None
    doc = call(
        f"list horizontalpodautoscalers in namespace {ns}",
        autoscaling.list_namespaced_horizontal_pod_autoscaler,
        ns,
        _request_timeout=SAMPLE_TIMEOUT_S,
    )
    for hpa in sorted((doc or {}).get("items") or [], key=lambda h: h["metadata"]["name"]):
        ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        if ref.get("kind") == "Deployment" and ref.get("name") == target.deployment:
            return str(hpa["metadata"]["name"])
    return None


def hpa_state(autoscaling: Any, namespace: str, name: str) -> dict[str, Any]:
    """``{"name", "desired", "current", "min", "max", "last_scale_time"}`` of an HPA.

    Raises:
        K8sError: the GET failed.
    """
    doc = call(
        f"get horizontalpodautoscaler {namespace}/{name}",
        autoscaling.read_namespaced_horizontal_pod_autoscaler,
        name,
        namespace,
        _request_timeout=SAMPLE_TIMEOUT_S,
    )
    status = doc.get("status") or {}
    spec = doc.get("spec") or {}
    return {
        "name": name,
        "desired": status.get("desiredReplicas"),
        "current": status.get("currentReplicas"),
        "min": spec.get("minReplicas"),
        "max": spec.get("maxReplicas"),
        "last_scale_time": status.get("lastScaleTime"),
    }


class _Apis:
    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.discovery = client.DiscoveryV1Api(api_client)
        self.autoscaling = client.AutoscalingV2Api(api_client)


# -- the sampler ------------------------------------------------------------------------------------

_RUNNING: dict[str, Sampler] = {}
_LOCK = threading.Lock()


class Sampler:
    """Background sampler of one target into ``path`` (see the module docstring).

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
        self.apis = _Apis(api_client)
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
            A ``{"type": "sample", ...}`` line (see the module docstring); failed reads are null
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


# -- figures from the observation file ----------------------------------------------------------


def read_observations(path: Path) -> list[dict[str, Any]]:
    """The lines of an observation file (unparsable lines, e.g. a torn last one, skipped).

    Returns:
        The JSON objects in file order; ``[]`` when the file does not exist.
    """
    out: list[dict[str, Any]] = []
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


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


# -- traffic-spike: wait for the scale-out --------------------------------------------------------


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
    a = _Apis(api_client)
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
        if (_ts(p["metadata"].get("creationTimestamp")) or 0.0) < cutoff
    }
    sources: dict[str, str | None] = {}
    desired0 = (hpa0 or {}).get("desired")
    hpa_rose_at: float | None = None
    if hpa0 is not None and desired0 is not None:
        last_scale = _ts(hpa0.get("last_scale_time"))
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
                created = _ts(p["metadata"].get("creationTimestamp")) if first else now
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
                api_at = _ts(cond.get("lastTransitionTime"))
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


atexit.register(stop_all)
