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

Modules (a package since issue #12; the names below are re-exported here, where the activities
and the evidence kinds import them): ``common`` (file name, limits, timestamps, API clients; a
leaf), one module per kind read (``endpoints``, ``pods``, ``nodes``, ``events``, ``hpa``),
``sampler`` (the background sampler), ``figures`` (series and figures from the file) and
``scale_out`` (the traffic-spike wait).
"""

from chaoslib_infer.platforms.kubernetes.observe.common import (
    DEFAULT_MAX_DURATION_S,
    OBSERVATIONS_FILE,
)
from chaoslib_infer.platforms.kubernetes.observe.common import (
    SAMPLE_TIMEOUT_S as SAMPLE_TIMEOUT_S,
)
from chaoslib_infer.platforms.kubernetes.observe.endpoints import list_endpoints
from chaoslib_infer.platforms.kubernetes.observe.events import EventTracker, list_events
from chaoslib_infer.platforms.kubernetes.observe.figures import (
    observation_figures,
    observation_series,
    read_observations,
)
from chaoslib_infer.platforms.kubernetes.observe.hpa import find_hpa, hpa_state
from chaoslib_infer.platforms.kubernetes.observe.nodes import node_state
from chaoslib_infer.platforms.kubernetes.observe.pods import (
    container_status,
    list_target_pods,
    pod_state,
)
from chaoslib_infer.platforms.kubernetes.observe.sampler import STOP_JOIN_S as STOP_JOIN_S
from chaoslib_infer.platforms.kubernetes.observe.sampler import (
    Sampler,
    running_sampler,
    stop_all,
)
from chaoslib_infer.platforms.kubernetes.observe.scale_out import wait_scale_out

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
