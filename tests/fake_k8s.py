"""An HTTP-level fake Kubernetes API server for the Kubernetes action tests.

The official ``kubernetes`` client talks to it over real HTTP on 127.0.0.1 (port 0 = a free port),
through a kubeconfig written by :meth:`FakeK8s.write_kubeconfig`. It keeps objects in memory and
implements what the actions use, the way the real API server answers:

- GET / LIST (``labelSelector`` with ``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``, ``!key``;
  ``fieldSelector`` on ``spec.nodeName``, ``metadata.name``, ``metadata.namespace``,
  ``status.phase``), POST, PUT (unconditional or with a matching ``resourceVersion``, else 409),
  PATCH (``application/merge-patch+json`` per RFC 7386 and ``application/strategic-merge-patch+json``
  with merge-by-name for container lists), DELETE; ``/api/v1/pods`` across namespaces;
- ``pods/eviction`` (POST): 400 for a body that is not a ``policy/v1`` Eviction naming the URL's
  pod and namespace; 429 ``TooManyRequests`` when a PodDisruptionBudget selecting the pod
  allows no disruption, else the pod is deleted (201 Status Success);
- ``pods/ephemeralcontainers`` (PATCH): the new containers get a terminated status with exit code 0
  (as ``tc`` exits at once); 403 when :attr:`FakeK8s.pod_security` is ``"baseline"`` or
  ``"restricted"`` and a container adds a capability (the Pod Security admission message);
- a ReplicaSet "controller": a deleted or evicted pod owned by a ReplicaSet is replaced by a new pod
  (Pending, then scheduled on a schedulable node after ``schedule_delay_s``, then Ready after
  ``ready_delay_s`` more), as the real controller and scheduler would;
- :meth:`FakeK8s.forbid` answers 403 for a (verb, resource) pair, as RBAC would;
- ``pods/{name}/exec`` (issue 4): the WebSocket upgrade (GET or POST, subprotocol v5/v4
  ``channel.k8s.io``) authorized as ``get`` *and* ``create`` (1.35+), the command recorded, run by
  :attr:`FakeK8s.exec_handler` (an :class:`ExecCall` -> :class:`ExecReply`) and answered on
  channels 1/2/3; a NoExecute taint evicts the pods that do not tolerate it (taint manager); a
  deleted Node's pods are deleted after ``podgc_delay_s`` (pod GC); NetworkPolicies; PATCH with a
  stale ``metadata.resourceVersion`` answers 409; POST refuses a ``resourceVersion``;
- observation (issue 4): Services and their ``discovery.k8s.io/v1`` EndpointSlices, kept in step with
  pod readiness by an "endpoint controller" (``endpoint_delay_s`` after each pod change, at most
  ``slice_size`` endpoints per slice); core/v1 Events emitted by the simulated controllers
  (``Killing``, ``SuccessfulCreate``, new-style ``Scheduled`` with ``eventTime``, ``Started``,
  ``NodeNotReady``, aggregated ``Pulled``/``Created``/``Started`` on a container restart, with
  ``count``), ``autoscaling/v2`` HorizontalPodAutoscalers; scripted changes
  :meth:`FakeK8s.restart_container` (OOMKilled), :meth:`FakeK8s.set_node_ready`,
  :meth:`FakeK8s.scale` (Deployment scale-up through the ReplicaSet simulation) and
  :meth:`FakeK8s.hpa_rescale`.

Every request is recorded in :attr:`FakeK8s.requests` (method, path, query, body, content type,
status) so tests assert the exact calls.
"""

from __future__ import annotations

import copy
import json
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

__all__ = [
    "ALL_REQUESTS",
    "QuietServer",
    "OPEN_FAKES",
    "ExecCall",
    "ExecReply",
    "FakeK8s",
    "Request",
    "make_cluster",
    "ready_pod",
    "write_target",
]

#: Every request any FakeK8s of this test session received, added when it closes (for the RBAC
#: coverage test, which tests/conftest.py runs last so that every other fake has closed).
ALL_REQUESTS: list[Request] = []
#: ``id()`` of each FakeK8s started and not closed yet: empty means ALL_REQUESTS holds every
#: request sent so far.
OPEN_FAKES: set[int] = set()

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)
_KINDS = {
    "pods": "Pod",
    "nodes": "Node",
    "resourcequotas": "ResourceQuota",
    "events": "Event",
    "deployments": "Deployment",
    "replicasets": "ReplicaSet",
    "daemonsets": "DaemonSet",
    "poddisruptionbudgets": "PodDisruptionBudget",
    "networkpolicies": "NetworkPolicy",
    "services": "Service",
    "endpointslices": "EndpointSlice",
    "horizontalpodautoscalers": "HorizontalPodAutoscaler",
}
_CLUSTER_SCOPED = {"nodes"}
# `chaos-infer schedule` output (created as `kubectl apply` would) and the load workers' Jobs
_KINDS.update(
    configmaps="ConfigMap",
    serviceaccounts="ServiceAccount",
    jobs="Job",
    cronjobs="CronJob",
    roles="Role",
    rolebindings="RoleBinding",
    clusterroles="ClusterRole",
    clusterrolebindings="ClusterRoleBinding",
)
_CLUSTER_SCOPED |= {"clusterroles", "clusterrolebindings"}
_MERGE_BY_NAME = {"containers", "ephemeralContainers", "initContainers", "volumes", "env"}
_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


class QuietServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that drops a client's connection reset or broken pipe silently.

    The interruption tests SIGKILL the drill runner mid-request; the stock server then prints a
    ConnectionResetError traceback to the test process' stderr, where a later in-process CLI
    call (the rollback replay, asserted to print nothing on stderr) picks it up. Any other error
    is still printed.
    """

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)


@dataclass
class Request:
    """One recorded request to the fake API server."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    content_type: str | None
    status: int = 0
    verb: str = ""  # RBAC verb: get, list, create, update, patch, delete
    group: str = ""  # API group ("" for core)
    resource: str = ""  # "pods", "pods/eviction", ...
    command: list[str] | None = None  # pods/exec over WebSocket: the ``command`` query params
    also_verbs: tuple[str, ...] = ()  # further RBAC verbs checked (WebSocket exec: "create")


@dataclass
class ExecCall:
    """One command run through ``pods/{name}/exec`` (what the test's exec handler receives)."""

    namespace: str
    pod: str
    container: str
    command: list[str]


@dataclass
class ExecReply:
    """What a test's exec handler answers: stdout/stderr and the command's end.

    ``exit_code`` None: the command did not run (``message`` says why, as the container runtime
    does, e.g. :meth:`not_found`).
    """

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = 0
    message: str = ""

    @classmethod
    def not_found(cls, exe: str) -> ExecReply:
        """The runtime's answer when the image has no ``exe`` (real containerd/runc wording)."""
        return cls(
            exit_code=None,
            message=f'failed to exec in container: failed to start exec "{"ab" * 32}": OCI runtime '
            "exec failed: exec failed: unable to start container process: exec: "
            f'"{exe}": executable file not found in $PATH: unknown',
        )

    def status(self, command: list[str]) -> dict[str, Any]:
        """The ``Status`` document the API server sends on channel 3 at the end."""
        if self.exit_code == 0:
            return {"metadata": {}, "status": "Success"}
        if self.exit_code is None:
            return {
                "metadata": {},
                "status": "Failure",
                "message": self.message,
                "reason": "InternalError",
                "details": {"causes": [{"message": self.message}]},
                "code": 500,
            }
        return {
            "metadata": {},
            "status": "Failure",
            "message": "command terminated with non-zero exit code: error executing command "
            f"[{' '.join(command)}], exit code {self.exit_code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(self.exit_code)}]},
        }


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _status(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 400 else "Success",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        out["details"] = details
    return out


def merge_patch(target: Any, patch: Any, strategic: bool = False) -> Any:
    """RFC 7386 merge patch; with ``strategic``, lists of named objects merge by ``name``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif strategic and key in _MERGE_BY_NAME and isinstance(value, list):
            merged = list(out.get(key) or [])
            for item in value:
                idx = next(
                    (i for i, x in enumerate(merged) if x.get("name") == item.get("name")), None
                )
                if idx is None:
                    merged.append(copy.deepcopy(item))
                else:
                    merged[idx] = merge_patch(merged[idx], item, strategic)
            out[key] = merged
        else:
            out[key] = merge_patch(out.get(key), value, strategic)
    return out


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def label_match(selector: str, labels: dict[str, str]) -> bool:
    """Whether ``labels`` satisfy a Kubernetes label selector string."""
    for term in _split_selector(selector):
        m = re.match(r"^([^\s!=]+)\s+(in|notin)\s+\((.*)\)$", term)
        if m:
            values = {v.strip() for v in m.group(3).split(",")}
            has = m.group(1) in labels and labels[m.group(1)] in values
            if has != (m.group(2) == "in"):
                return False
        elif "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = re.split(r"==?", term, maxsplit=1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def _dig(obj: dict[str, Any], dotted: str) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def field_match(selector: str, obj: dict[str, Any]) -> bool:
    """Whether ``obj`` satisfies a field selector (``=``, ``==``, ``!=`` terms)."""
    for term in _split_selector(selector):
        neg = "!=" in term
        k, v = re.split(r"!=|==?", term, maxsplit=1)
        actual = _dig(obj, k.strip()) or ""
        if (actual == v.strip()) == neg:
            return False
    return True


def selector_string(match_labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


class FakeK8s:
    """The fake API server (threaded ``http.server``); use as a context manager."""

    #: False: this fake's requests are not chaos-infer's own (e.g. an admin applying the
    #: ``chaos-infer schedule`` output): kept out of :data:`ALL_REQUESTS` (the RBAC test).
    rbac_subject = True
    #: Job "kubelet": ``run_pod(pod) -> (exit_code, log_text)`` runs an Indexed Job's pod (in a
    #: thread); None: pods of a Job stay Pending.
    run_pod: Callable[[dict[str, Any]], tuple[int, str]] | None = None

    def __init__(
        self,
        schedule_delay_s: float = 0.2,
        ready_delay_s: float = 0.3,
        endpoint_delay_s: float = 0.0,
    ) -> None:
        self.objects: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}
        self.requests: list[Request] = []
        self.forbidden: set[tuple[str, str]] = set()
        self.pod_security = "privileged"
        self.ephemeral_result: tuple[int, str] = (0, "")  # (exitCode, termination message)
        self.exec_handler: Callable[[ExecCall], ExecReply] | None = None  # pods/exec commands
        self.podgc_delay_s = 0.1  # Node deleted -> its pods deleted (real PodGC: ~40 s quarantine)
        self.schedule_delay_s = schedule_delay_s
        self.ready_delay_s = ready_delay_s
        self.endpoint_delay_s = endpoint_delay_s  # pod change -> EndpointSlice update
        self.slice_size = 100  # endpoints per EndpointSlice (the controller's default)
        self._ev_seq = 0
        self.lock = threading.RLock()
        self._rv = 1000
        self._seq = 0
        self._timers: list[threading.Timer] = []
        self._server = QuietServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(  # short poll: shutdown() returns in 0.05 s, not 0.5 s
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeK8s:
        OPEN_FAKES.add(id(self))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for t in self._timers:
            t.cancel()
        for job_thread in getattr(self, "_job_threads", []):
            job_thread.join(timeout=30)
        self._server.shutdown()
        self._server.server_close()
        if self.rbac_subject:  # after the shutdown: no request can arrive any more
            ALL_REQUESTS.extend(self.requests)
        OPEN_FAKES.discard(id(self))

    def write_kubeconfig(self, path: Path, contexts: tuple[str, ...] = ("kind-lab",)) -> Path:
        """Write a kubeconfig whose contexts all point at this server; the first is current."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "fake-token"}}],
            "contexts": [
                {
                    "name": c,
                    "context": {"cluster": "fake", "user": "tester", "namespace": "default"},
                }
                for c in contexts
            ],
            "current-context": contexts[0],
        }
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        return path

    # -- store -----------------------------------------------------------------------------
    def _bucket(self, group: str, resource: str) -> dict[tuple[str, str], dict[str, Any]]:
        return self.objects.setdefault((group, resource), {})

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def put(self, group: str, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store (create or overwrite) an object directly, bumping its resourceVersion."""
        with self.lock:
            meta = obj.setdefault("metadata", {})
            meta["resourceVersion"] = self._next_rv()
            meta.setdefault("uid", f"uid-{resource}-{meta['name']}")
            meta.setdefault("creationTimestamp", _now())
            ns = "" if resource in _CLUSTER_SCOPED else meta.get("namespace", "default")
            self._bucket(group, resource)[(ns, meta["name"])] = obj
            if group == "" and resource in ("pods", "services"):
                self._pods_changed(ns)
            return obj

    def get(self, group: str, resource: str, name: str, ns: str = "") -> dict[str, Any] | None:
        with self.lock:
            obj = self._bucket(group, resource).get((ns, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, group: str, resource: str, ns: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [
                copy.deepcopy(o)
                for (ons, _), o in sorted(self._bucket(group, resource).items())
                if ns is None or ons == ns
            ]

    def pods(self, ns: str | None = None, selector: str = "") -> list[dict[str, Any]]:
        return [
            p
            for p in self.list("", "pods", ns)
            if label_match(selector, p["metadata"].get("labels") or {})
        ]

    def forbid(self, verb: str, resource: str) -> None:
        """Answer 403 (RBAC style) to ``verb`` on ``resource`` (e.g. ``("create", "pods/eviction")``)."""
        self.forbidden.add((verb, resource))

    def calls(self, method: str | None = None, contains: str = "") -> list[Request]:
        """Recorded requests, optionally filtered by method and a path substring."""
        with self.lock:
            return [
                r
                for r in self.requests
                if (method is None or r.method == method) and contains in r.path
            ]

    # -- controller simulation ---------------------------------------------------------------
    def _later(self, delay: float, fn: Callable[[], None]) -> None:
        t = threading.Timer(delay, fn)
        t.daemon = True
        self._timers.append(t)
        t.start()

    def _on_pod_gone(self, pod: dict[str, Any]) -> None:
        owners = pod["metadata"].get("ownerReferences") or []
        rs = next((o for o in owners if o.get("kind") == "ReplicaSet"), None)
        if rs is None:
            return
        self._spawn_pod(pod, rs)

    def _spawn_pod(self, pod: dict[str, Any], rs: dict[str, Any]) -> None:
        """A new pod of ReplicaSet ``rs`` (owner reference) like ``pod``: Pending, then scheduled,
        then Ready (``schedule_delay_s``, ``ready_delay_s``), with the controllers' events."""
        self._seq += 1
        new = copy.deepcopy(pod)
        meta = new["metadata"]
        meta["name"] = f"{rs['name']}-n{self._seq:04d}"
        meta["uid"] = f"uid-pod-{meta['name']}"
        meta["creationTimestamp"] = _now()
        meta.pop("deletionTimestamp", None)
        new["spec"].pop("nodeName", None)
        new["spec"].pop("ephemeralContainers", None)
        new["status"] = {
            "phase": "Pending",
            "qosClass": pod.get("status", {}).get("qosClass", "Burstable"),
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "lastTransitionTime": _now(),
                }
            ],
        }
        self.put("", "pods", new)
        ns, name = meta["namespace"], meta["name"]
        self.emit_event(
            ns,
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs["name"], "uid": rs["uid"]},
            "SuccessfulCreate",
            f"Created pod: {name}",
            component="replicaset-controller",
        )

        def schedule() -> None:
            with self.lock:
                p = self._bucket("", "pods").get((ns, name))
                nodes = [
                    n
                    for n in self.list("", "nodes")
                    if not n["spec"].get("unschedulable")
                    and not any(
                        t.get("effect") == "NoExecute" for t in n["spec"].get("taints") or []
                    )
                ]
                if p is None or not nodes:
                    return
                p["spec"]["nodeName"] = nodes[self._seq % len(nodes)]["metadata"]["name"]
                p["status"]["conditions"] = [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()}
                ]
                p["metadata"]["resourceVersion"] = self._next_rv()
                self.emit_event(
                    ns,
                    p,
                    "Scheduled",
                    f"Successfully assigned {ns}/{name} to {p['spec']['nodeName']}",
                    component="default-scheduler",
                    new_style=True,
                )
            self._later(self.ready_delay_s, ready)

        def ready() -> None:
            with self.lock:
                p = self._bucket("", "pods").get((ns, name))
                if p is None:
                    return
                p["status"] = ready_pod(p)["status"]
                p["metadata"]["resourceVersion"] = self._next_rv()
                first = p["spec"]["containers"][0]["name"]
                self.emit_event(
                    ns, p, "Started", f"Started container {first}", host=p["spec"]["nodeName"]
                )
                self._pods_changed(ns)

        self._later(self.schedule_delay_s, schedule)

    # -- observation: endpoints, events, restarts, node readiness, scaling ---------------------
    def _pods_changed(self, ns: str) -> None:
        """The endpoint controller reacts to a pod change in ``ns`` (after ``endpoint_delay_s``)."""
        if not ns:
            return
        if self.endpoint_delay_s > 0:
            self._later(self.endpoint_delay_s, lambda: self._sync_slices(ns))
        else:
            self._sync_slices(ns)

    def _sync_slices(self, ns: str) -> None:
        """Rewrite the EndpointSlices of every Service of ``ns`` that has a selector from the pods:
        one endpoint per pod with an IP, ``ready`` = pod Ready and not terminating."""
        with self.lock:
            bucket = self._bucket("discovery.k8s.io", "endpointslices")
            for svc in self.list("", "services", ns):
                sel = selector_string((svc.get("spec") or {}).get("selector") or {})
                if not sel:
                    continue
                svc_name = svc["metadata"]["name"]
                eps = []
                for pod in self.pods(ns, sel):
                    ip = (pod.get("status") or {}).get("podIP")
                    if not ip:
                        continue
                    gone = bool(pod["metadata"].get("deletionTimestamp"))
                    eps.append(
                        {
                            "addresses": [ip],
                            "conditions": {
                                "ready": _is_ready(pod) and not gone,
                                "serving": _is_ready(pod),
                                "terminating": gone,
                            },
                            "nodeName": pod["spec"].get("nodeName"),
                            "targetRef": {
                                "kind": "Pod",
                                "namespace": ns,
                                "name": pod["metadata"]["name"],
                                "uid": pod["metadata"]["uid"],
                            },
                        }
                    )
                n = self.slice_size
                chunks = [eps[i : i + n] for i in range(0, len(eps), n)] or [[]]
                keep = set()
                for i, chunk in enumerate(chunks):
                    slice_name = f"{svc_name}-{i:05d}"
                    keep.add(slice_name)
                    old = bucket.get((ns, slice_name))
                    if old is not None and old["endpoints"] == chunk:
                        continue
                    ports = (svc.get("spec") or {}).get("ports") or []
                    self.put(
                        "discovery.k8s.io",
                        "endpointslices",
                        {
                            "apiVersion": "discovery.k8s.io/v1",
                            "kind": "EndpointSlice",
                            "metadata": {
                                "name": slice_name,
                                "namespace": ns,
                                "labels": {
                                    "kubernetes.io/service-name": svc_name,
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                                },
                                "ownerReferences": [
                                    {
                                        "apiVersion": "v1",
                                        "kind": "Service",
                                        "name": svc_name,
                                        "uid": svc["metadata"]["uid"],
                                        "controller": True,
                                    }
                                ],
                            },
                            "addressType": "IPv4",
                            "endpoints": chunk,
                            "ports": [
                                {
                                    "name": pt.get("name"),
                                    "port": pt.get("targetPort", pt.get("port")),
                                    "protocol": pt.get("protocol", "TCP"),
                                }
                                for pt in ports
                            ],
                        },
                    )
                for (s_ns, s_name), obj in list(bucket.items()):
                    labels = obj["metadata"].get("labels") or {}
                    if (
                        s_ns == ns
                        and labels.get("kubernetes.io/service-name") == svc_name
                        and s_name not in keep
                    ):
                        del bucket[(s_ns, s_name)]

    def emit_event(
        self,
        ns: str,
        involved: dict[str, Any],
        reason: str,
        message: str,
        type_: str = "Normal",
        component: str = "kubelet",
        host: str | None = None,
        new_style: bool = False,
    ) -> dict[str, Any]:
        """Record a core/v1 Event about ``involved`` (an object, or a reference with kind/name/uid).

        Old-style events (kubelet, controllers) carry ``firstTimestamp``/``lastTimestamp``/``count``
        and are aggregated: the same object, reason and message bump ``count`` on the same Event
        (same uid). ``new_style`` events (the scheduler's) carry ``eventTime`` only.
        """
        with self.lock:
            meta = involved.get("metadata") or involved
            ref = {
                "apiVersion": involved.get("apiVersion", "v1"),
                "kind": involved.get("kind", "Pod"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace", ns) if involved.get("kind") != "Node" else None,
                "uid": meta.get("uid"),
            }
            now = _now()
            source = {"component": component, "host": host} if host else {"component": component}
            if not new_style:
                for ev in self._bucket("", "events").values():
                    if (
                        ev["metadata"]["namespace"] == ns
                        and ev["involvedObject"].get("uid") == ref["uid"]
                        and (ev["reason"], ev["message"]) == (reason, message)
                        and ev.get("count")
                    ):
                        ev["count"] += 1
                        ev["lastTimestamp"] = now
                        ev["metadata"]["resourceVersion"] = self._next_rv()
                        return copy.deepcopy(ev)
            self._ev_seq += 1
            t = time.time()
            return self.put(
                "",
                "events",
                {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {
                        "name": f"{ref['name']}.{int(t * 1e9) + self._ev_seq:x}",
                        "namespace": ns,
                        "uid": f"uid-event-{self._ev_seq:06d}",
                    },
                    "involvedObject": ref,
                    "reason": reason,
                    "message": message,
                    "type": type_,
                    "source": {} if new_style else source,
                    "reportingComponent": component,
                    "reportingInstance": host or "",
                    "firstTimestamp": None if new_style else now,
                    "lastTimestamp": None if new_style else now,
                    "eventTime": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))
                    + f".{int(t % 1 * 1e6):06d}Z"
                    if new_style
                    else None,
                    **({} if new_style else {"count": 1}),
                },
            )

    def _set_pod_ready(self, pod: dict[str, Any], ready: bool, reason: str = "") -> None:
        status = "True" if ready else "False"
        for c in pod["status"].get("conditions") or []:
            if c["type"] in ("Ready", "ContainersReady") and c["status"] != status:
                c["status"], c["lastTransitionTime"] = status, _now()
                if reason:
                    c["reason"] = reason
                else:
                    c.pop("reason", None)
        for cs in pod["status"].get("containerStatuses") or []:
            cs["ready"] = ready
        pod["metadata"]["resourceVersion"] = self._next_rv()

    def restart_container(
        self, ns: str, name: str, reason: str = "OOMKilled", down_s: float = 0.3
    ) -> None:
        """The kubelet restarts pod ``name``'s first container in place after it died of
        ``reason`` (exit code 137): ``restartCount`` + 1, ``lastState.terminated.reason``, not Ready
        for ``down_s`` seconds (its endpoint not ready), aggregated Pulled/Created/Started events."""
        with self.lock:
            pod = self._bucket("", "pods")[(ns, name)]
            cs = pod["status"]["containerStatuses"][0]
            now = _now()
            cs["lastState"] = {
                "terminated": {
                    "exitCode": 137,
                    "reason": reason,
                    "startedAt": (cs.get("state") or {}).get("running", {}).get("startedAt", now),
                    "finishedAt": now,
                    "containerID": cs.get("containerID"),
                }
            }
            cs["restartCount"] = int(cs.get("restartCount") or 0) + 1
            cs["state"] = {"running": {"startedAt": now}}
            self._set_pod_ready(pod, False, "ContainersNotReady")
            node = pod["spec"].get("nodeName")
            image = cs.get("image")
            for ev_reason, msg in (
                ("Pulled", f'Container image "{image}" already present on machine'),
                ("Created", f"Created container {cs['name']}"),
                ("Started", f"Started container {cs['name']}"),
            ):
                self.emit_event(ns, pod, ev_reason, msg, host=node)
        self._pods_changed(ns)

        def back() -> None:
            with self.lock:
                p = self._bucket("", "pods").get((ns, name))
                if p is None:
                    return
                self._set_pod_ready(p, True)
            self._pods_changed(ns)

        self._later(down_s, back)

    def set_node_ready(self, node: str, ready: bool) -> None:
        """Flip node ``node``'s Ready condition (False: ``Unknown``, the kubelet stopped posting
        status); as the node lifecycle controller does, its pods become (not) Ready, with a
        ``NodeNotReady`` warning event on each pod when it goes."""
        touched = set()
        with self.lock:
            n = self._bucket("", "nodes")[("", node)]
            for c in n["status"]["conditions"]:
                if c["type"] == "Ready":
                    c.update(
                        status="True" if ready else "Unknown",
                        reason="KubeletReady" if ready else "NodeStatusUnknown",
                        message="kubelet is posting ready status"
                        if ready
                        else "Kubelet stopped posting node status.",
                        lastTransitionTime=_now(),
                    )
            n["metadata"]["resourceVersion"] = self._next_rv()
            for (pns, _), pod in self._bucket("", "pods").items():
                if pod["spec"].get("nodeName") != node or not pod["status"].get("conditions"):
                    continue
                self._set_pod_ready(pod, ready)
                touched.add(pns)
                if not ready:
                    self.emit_event(
                        pns,
                        pod,
                        "NodeNotReady",
                        "Node is not ready",
                        type_="Warning",
                        component="node-controller",
                    )
        for pns in sorted(touched):
            self._pods_changed(pns)

    def scale(self, ns: str, deployment: str, replicas: int) -> None:
        """Scale Deployment ``deployment`` up to ``replicas`` (the scale subresource, as the HPA
        does): its ReplicaSet creates the missing pods through the ReplicaSet simulation."""
        with self.lock:
            dep = self._bucket("apps", "deployments")[(ns, deployment)]
            before = int(dep["spec"]["replicas"])
            dep["spec"]["replicas"] = replicas
            dep["metadata"]["resourceVersion"] = self._next_rv()
            rs = next(
                r
                for r in self.list("apps", "replicasets", ns)
                if any(
                    o.get("kind") == "Deployment" and o.get("name") == deployment
                    for o in r["metadata"].get("ownerReferences") or []
                )
            )
            self._bucket("apps", "replicasets")[(ns, rs["metadata"]["name"])]["spec"][
                "replicas"
            ] = replicas
            ref = {
                "kind": "ReplicaSet",
                "name": rs["metadata"]["name"],
                "uid": rs["metadata"]["uid"],
                "controller": True,
            }
            mine = [
                p
                for p in self.pods(ns)
                if any(
                    o.get("uid") == ref["uid"] for o in p["metadata"].get("ownerReferences") or []
                )
            ]
            if replicas < len(mine) or not mine:
                raise ValueError("the fake scales a Deployment with pods up only")
            self.emit_event(
                ns,
                dep,
                "ScalingReplicaSet",
                f"Scaled up replica set {ref['name']} to {replicas} from {before}",
                component="deployment-controller",
            )
            for _ in range(replicas - len(mine)):
                self._spawn_pod(mine[0], ref)

    def hpa_rescale(self, ns: str, name: str, desired: int, scale_after_s: float = 0.0) -> None:
        """HPA ``name`` decides ``desired`` replicas (``status.desiredReplicas``,
        ``lastScaleTime``, a ``SuccessfulRescale`` event), then after ``scale_after_s`` scales its
        target Deployment (:meth:`scale`) and reports ``currentReplicas``."""
        with self.lock:
            hpa = self._bucket("autoscaling", "horizontalpodautoscalers")[(ns, name)]
            hpa["status"]["desiredReplicas"] = desired
            hpa["status"]["lastScaleTime"] = _now()
            hpa["metadata"]["resourceVersion"] = self._next_rv()
            target = hpa["spec"]["scaleTargetRef"]["name"]
            self.emit_event(
                ns,
                hpa,
                "SuccessfulRescale",
                f"New size: {desired}; reason: pods metric vllm:num_requests_waiting above target",
                component="horizontal-pod-autoscaler",
            )

        def act() -> None:
            self.scale(ns, target, desired)
            with self.lock:
                h = self._bucket("autoscaling", "horizontalpodautoscalers")[(ns, name)]
                h["status"]["currentReplicas"] = desired
                h["metadata"]["resourceVersion"] = self._next_rv()

        if scale_after_s > 0:
            self._later(scale_after_s, act)
        else:
            act()

    def _pod_killed(self, pod: dict[str, Any]) -> None:
        """A deleted (or evicted) pod: the kubelet's ``Killing`` event, endpoints updated."""
        ns = pod["metadata"]["namespace"]
        for c in pod["spec"].get("containers") or []:
            self.emit_event(
                ns,
                pod,
                "Killing",
                f"Stopping container {c['name']}",
                host=pod["spec"].get("nodeName"),
            )
        self._pods_changed(ns)

    def _pdb_refusal(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        ns = pod["metadata"]["namespace"]
        labels = pod["metadata"].get("labels") or {}
        for pdb in self.list("policy", "poddisruptionbudgets", ns):
            sel = selector_string(pdb["spec"].get("selector", {}).get("matchLabels", {}))
            if not label_match(sel, labels):
                continue
            matching = self.pods(ns, sel)
            healthy = sum(1 for p in matching if _is_ready(p))
            if "minAvailable" in pdb["spec"]:
                allowed = healthy - int(pdb["spec"]["minAvailable"])
                need = int(pdb["spec"]["minAvailable"])
            else:
                allowed = int(pdb["spec"]["maxUnavailable"]) - (len(matching) - healthy)
                need = len(matching) - int(pdb["spec"]["maxUnavailable"])
            if allowed <= 0:
                name = pdb["metadata"]["name"]
                return _status(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    causes=[
                        {
                            "reason": "DisruptionBudget",
                            "message": f"The disruption budget {name} needs {need} healthy pods "
                            f"and has {healthy} currently",
                        }
                    ],
                )
        return None

    # -- issue 4: pods/exec over WebSocket, the taint manager, pod GC of deleted nodes ---------
    def _exec_check(self, req: Request, pod: dict[str, Any]) -> tuple[int, Any]:
        """Validate an exec request like the API server; (101, ExecCall) when it may upgrade."""
        names = [c["name"] for c in pod["spec"].get("containers") or []]
        container = req.query.get("container") or (names[0] if len(names) == 1 else "")
        if container not in names:
            return 400, _status(
                400,
                "BadRequest",
                f"container {container} is not valid for pod {pod['metadata']['name']}",
            )
        if req.command is None:
            return 400, _status(400, "BadRequest", "Upgrade request required")
        if not req.command:
            return 400, _status(
                400, "BadRequest", "you must specify at least one command for the container"
            )
        meta = pod["metadata"]
        return 101, ExecCall(meta["namespace"], meta["name"], container, list(req.command))

    def _serve_exec(self, handler: BaseHTTPRequestHandler) -> None:
        """Serve a ``pods/{name}/exec`` WebSocket upgrade (GET or POST) as the API server does.

        The handshake and framing are the ``websockets`` library's sans-I/O server protocol
        (RFC 6455); subprotocols ``v5.channel.k8s.io`` then ``v4.channel.k8s.io``. The command
        is recorded (``Request.command``), run by :attr:`exec_handler` (outside the lock, it may
        take time), and answered on channels 1 (stdout), 2 (stderr) and 3 (``Status`` JSON).
        """
        from websockets.datastructures import Headers
        from websockets.http11 import Request as WsRequest
        from websockets.protocol import State
        from websockets.server import ServerProtocol
        from websockets.typing import Subprotocol

        split = urlsplit(handler.path)
        qs = parse_qs(split.query)
        req = Request(
            handler.command,
            split.path,
            {k: v[-1] for k, v in qs.items()},
            None,
            handler.headers.get("Content-Type"),
            command=qs.get("command", []),
        )
        with self.lock:
            self.requests.append(req)
            code, payload = self._dispatch(req)
            req.status = code
        handler.close_connection = True
        sock = handler.connection
        if code != 101:
            data = json.dumps(payload).encode()
            handler.send_response(code)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
            return
        proto = ServerProtocol(
            subprotocols=[Subprotocol("v5.channel.k8s.io"), Subprotocol("v4.channel.k8s.io")]
        )
        response = proto.accept(WsRequest(handler.path, Headers(list(handler.headers.items()))))
        proto.send_response(response)
        sock.sendall(b"".join(proto.data_to_send()))
        if response.status_code != 101:
            return
        call: ExecCall = payload
        try:
            if self.exec_handler is None:
                raise RuntimeError("no exec handler set on the fake")
            reply = self.exec_handler(call)
        except Exception as exc:  # a broken or missing test handler: answer like a runtime error
            reply = ExecReply(exit_code=None, message=f"fake exec handler failed: {exc}")
        for channel, text in ((1, reply.stdout), (2, reply.stderr)):
            if text:
                proto.send_binary(bytes([channel]) + text.encode())
        proto.send_binary(b"\x03" + json.dumps(reply.status(call.command)).encode())
        proto.send_close(1000)
        sock.sendall(b"".join(proto.data_to_send()))
        sock.settimeout(2.0)
        try:  # wait (bounded) for the client's closing frame, then drop the connection
            while proto.state is not State.CLOSED:
                data = sock.recv(4096)
                if not data:
                    break
                proto.receive_data(data)
        except OSError:
            pass

    @staticmethod
    def _tolerates(pod: dict[str, Any], taint: dict[str, Any]) -> bool:
        for tol in pod["spec"].get("tolerations") or []:
            if tol.get("effect") not in (None, "", taint.get("effect")):
                continue
            if tol.get("operator") == "Exists":
                if not tol.get("key") or tol.get("key") == taint.get("key"):
                    return True
            elif tol.get("key") == taint.get("key") and tol.get("value") == taint.get("value"):
                return True
        return False

    def _taint_manager(self, node: str) -> None:
        """The taint manager: delete the pods of ``node`` that do not tolerate one of its
        NoExecute taints (``tolerationSeconds`` is not simulated: a toleration keeps the pod)."""
        with self.lock:
            spec = (self._bucket("", "nodes").get(("", node)) or {}).get("spec") or {}
            taints = [t for t in spec.get("taints") or [] if t.get("effect") == "NoExecute"]
            if not taints:
                return
            pods = self._bucket("", "pods")
            for key, pod in list(pods.items()):
                if pod["spec"].get("nodeName") != node:
                    continue
                if all(self._tolerates(pod, t) for t in taints):
                    continue
                del pods[key]
                self._pod_killed(pod)
                self._on_pod_gone(pod)

    def _podgc(self, node: str) -> None:
        """Pod GC: the pods bound to a Node that no longer exists are deleted (and replaced)."""
        with self.lock:
            if ("", node) in self._bucket("", "nodes"):
                return
            pods = self._bucket("", "pods")
            for key, pod in list(pods.items()):
                if pod["spec"].get("nodeName") == node:
                    del pods[key]
                    self._pod_killed(pod)
                    self._on_pod_gone(pod)

    # -- HTTP ------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out at once (no 40 ms ACK stall)

            def log_message(self, *args: object) -> None:
                pass

            def _serve(self) -> None:
                if (self.headers.get("Upgrade") or "").lower() == "websocket":
                    fake._serve_exec(self)
                    return
                split = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(split.query).items()}
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                req = Request(
                    self.command, split.path, query, body, self.headers.get("Content-Type")
                )
                with fake.lock:
                    fake.requests.append(req)
                    code, payload = fake._dispatch(req)
                    req.status = code
                text = isinstance(payload, str)  # pods/log answers plain text
                data = payload.encode() if text else json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain" if text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        return Handler

    def _dispatch(self, req: Request) -> tuple[int, Any]:
        if req.path in ("/version", "/version/"):
            return 200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-fake"}
        m = _PATH.match(req.path)
        if not m:
            return 404, _status(404, "NotFound", "the server could not find the requested resource")
        group = "" if m.group("core") else m.group("group")
        resource, name, sub, ns = (
            m.group("resource"),
            m.group("name"),
            m.group("sub"),
            m.group("ns"),
        )
        if resource == "namespaces" and name and sub is None:
            return 404, _status(404, "NotFound", "namespaces are not served by the fake")
        verb = _VERBS[req.method]
        if req.method == "GET" and name is None:
            verb = "list"
        req.verb, req.group = verb, group
        req.resource = f"{resource}/{sub}" if sub else resource
        if sub == "exec" and req.method == "GET":
            req.also_verbs = ("create",)  # 1.35+ (KEP-4006): WebSocket upgrades also need create
        denied = next(
            (v for v in (verb, *req.also_verbs) if (v, req.resource) in self.forbidden), None
        )
        if denied:
            verb = denied
            where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
            return 403, _status(
                403,
                "Forbidden",
                f'{resource} "{name or ""}" is forbidden: User "system:serviceaccount:chaos:'
                f'chaos-infer" cannot {verb} resource "{req.resource}" in API group "{group}"{where}',
            )
        if resource not in _KINDS:
            return 404, _status(404, "NotFound", f"the server could not find resource {resource}")
        if resource == "endpointslices" and ns and self.endpoint_delay_s == 0:
            self._sync_slices(ns)  # also follows pod statuses a test wrote into self.objects
        bucket = self._bucket(group, resource)
        key_ns = "" if resource in _CLUSTER_SCOPED else (ns or "")
        if name is None:
            if req.method == "GET":
                items = [
                    copy.deepcopy(o)
                    for (ons, _), o in sorted(bucket.items())
                    if (ns is None or ons == ns)
                    and label_match(
                        req.query.get("labelSelector", ""), o["metadata"].get("labels") or {}
                    )
                    and field_match(req.query.get("fieldSelector", ""), o)
                ]
                return 200, {
                    "kind": _KINDS[resource] + "List",
                    "apiVersion": f"{group}/{m.group('version')}" if group else "v1",
                    "metadata": {"resourceVersion": str(self._rv)},
                    "items": items,
                }
            if req.method == "POST":
                obj = copy.deepcopy(req.body)
                if obj["metadata"].get("resourceVersion"):
                    return 400, _status(
                        400,
                        "BadRequest",
                        "resourceVersion should not be set on objects to be created",
                    )
                if ns:
                    obj["metadata"].setdefault("namespace", ns)
                self._seq += 1
                obj["metadata"]["uid"] = f"uid-{resource}-{obj['metadata']['name']}-{self._seq:04d}"
                if (key_ns, obj["metadata"]["name"]) in bucket:
                    return 409, _status(
                        409,
                        "AlreadyExists",
                        f'{resource} "{obj["metadata"]["name"]}" already exists',
                    )
                created = self.put(group, resource, obj)
                if resource == "jobs":
                    self._start_job(created)
                return 201, copy.deepcopy(created)
            return 405, _status(405, "MethodNotAllowed", "method not allowed")
        current = bucket.get((key_ns, name))
        if current is None:
            return 404, _status(
                404, "NotFound", f'{resource} "{name}" not found', name=name, kind=resource
            )
        if sub == "exec":
            return self._exec_check(req, current)
        if sub == "eviction" and req.method == "POST":
            bad = _bad_eviction(req.body, key_ns, name)
            if bad is not None:
                return 400, _status(400, "BadRequest", bad)
            refusal = self._pdb_refusal(current)
            if refusal is not None:
                return 429, refusal
            del bucket[(key_ns, name)]
            self._pod_killed(current)
            self._on_pod_gone(current)
            return 201, _status(201, "", "", name=name, kind="pods") | {"status": "Success"}
        if sub == "log" and req.method == "GET" and resource == "pods":
            return 200, getattr(self, "_logs", {}).get((key_ns, name), "")
        if sub not in (None, "ephemeralcontainers", "status"):
            return 404, _status(404, "NotFound", f"no subresource {sub}")
        if req.method == "GET":
            return 200, copy.deepcopy(current)
        if req.method == "DELETE":
            del bucket[(key_ns, name)]
            if resource == "pods":
                self._pod_killed(current)
                self._on_pod_gone(current)
            if resource == "nodes":
                self._later(self.podgc_delay_s, lambda: self._podgc(name))
            if resource == "jobs" and (req.body or {}).get("propagationPolicy") != "Orphan":
                for pod in self.pods(key_ns, f"batch.kubernetes.io/job-name={name}"):
                    self._bucket("", "pods").pop((key_ns, pod["metadata"]["name"]), None)
            return 200, copy.deepcopy(current)
        if req.method == "PUT":
            body = copy.deepcopy(req.body)
            rv = body.get("metadata", {}).get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                return 409, _status(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {resource} "{name}": '
                    "the object has been modified; please apply your changes to the "
                    "latest version and try again",
                )
            body.setdefault("metadata", {})
            for keep in ("uid", "creationTimestamp"):
                body["metadata"][keep] = current["metadata"].get(keep)
            if "status" in current:
                body["status"] = current["status"]
            return 200, self.put(group, resource, body)
        if req.method == "PATCH":
            rv = ((req.body or {}).get("metadata") or {}).get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                return 409, _status(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                )
            ctype = (req.content_type or "").split(";")[0]
            if ctype not in (
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
            ):
                return 415, _status(
                    415, "UnsupportedMediaType", f"the fake does not support {ctype}"
                )
            if sub == "ephemeralcontainers":
                added = (req.body or {}).get("spec", {}).get("ephemeralContainers") or []
                if self.pod_security in ("baseline", "restricted") and any(
                    (c.get("securityContext") or {}).get("capabilities", {}).get("add")
                    for c in added
                ):
                    c = added[0]
                    caps = ", ".join(f'"{x}"' for x in c["securityContext"]["capabilities"]["add"])
                    return 403, _status(
                        403,
                        "Forbidden",
                        f'pods "{name}" is forbidden: violates PodSecurity "{self.pod_security}:latest":'
                        f' non-default capabilities (container "{c["name"]}" must not include {caps}'
                        " in securityContext.capabilities.add)",
                    )
            patched = merge_patch(current, req.body, ctype.startswith("application/strategic"))
            patched["metadata"]["name"] = name
            if sub == "ephemeralcontainers":
                statuses = patched["status"].setdefault("ephemeralContainerStatuses", [])
                known = {s["name"] for s in statuses}
                for c in patched["spec"].get("ephemeralContainers") or []:
                    if c["name"] not in known:
                        statuses.append(
                            {
                                "name": c["name"],
                                "image": c.get("image"),
                                "ready": False,
                                "restartCount": 0,
                                "state": {
                                    "terminated": {
                                        "exitCode": self.ephemeral_result[0],
                                        "reason": "Completed"
                                        if self.ephemeral_result[0] == 0
                                        else "Error",
                                        "message": self.ephemeral_result[1],
                                        "finishedAt": _now(),
                                    }
                                },
                            }
                        )
            bucket[(key_ns, name)] = patched
            patched["metadata"]["resourceVersion"] = self._next_rv()
            if resource == "pods":
                self._pods_changed(key_ns)
            if resource == "nodes":
                self._taint_manager(name)
            return 200, copy.deepcopy(patched)
        return 405, _status(405, "MethodNotAllowed", "method not allowed")

    # -- Job controller (load workers) ---------------------------------------------------------
    def _start_job(self, job: dict[str, Any]) -> None:
        """Create a Job's pods as the Job controller does (Indexed: the completion index in an
        annotation, a label and ``$JOB_COMPLETION_INDEX``) and run each with :attr:`run_pod` in a
        thread: its exit code sets the pod phase, its text becomes the pod log, and the Job's
        ``status.succeeded``/``failed`` and ``Complete``/``Failed`` condition follow."""
        meta, spec = job["metadata"], job["spec"]
        ns, name = meta["namespace"], meta["name"]
        n = int(spec.get("completions") or 1)
        indexed = spec.get("completionMode") == "Indexed"
        template = spec["template"]
        self._logs: dict[tuple[str, str], str] = getattr(self, "_logs", {})
        self._job_threads: list[threading.Thread] = getattr(self, "_job_threads", [])
        for i in range(n):
            pod_labels = {
                **(template.get("metadata", {}).get("labels") or {}),
                "batch.kubernetes.io/job-name": name,
                "job-name": name,
            }
            annotations = {}
            pod_spec = copy.deepcopy(template["spec"])
            if indexed:
                pod_labels["batch.kubernetes.io/job-completion-index"] = str(i)
                annotations["batch.kubernetes.io/job-completion-index"] = str(i)
                for c in pod_spec.get("containers") or []:
                    c.setdefault("env", []).append(
                        {"name": "JOB_COMPLETION_INDEX", "value": str(i)}
                    )
            pod = self.put(
                "",
                "pods",
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{name}-{i}-x{self._next_rv()[-4:]}",
                        "namespace": ns,
                        "labels": pod_labels,
                        "annotations": annotations,
                        "ownerReferences": [
                            {"apiVersion": "batch/v1", "kind": "Job", "name": name,
                             "uid": meta.get("uid"), "controller": True}
                        ],
                    },
                    "spec": pod_spec,
                    "status": {"phase": "Pending"},
                },
            )  # fmt: skip
            thread = threading.Thread(target=self._run_job_pod, args=(ns, name, n, pod))
            thread.daemon = True
            self._job_threads.append(thread)
            thread.start()

    def _run_job_pod(self, ns: str, job_name: str, n: int, pod: dict[str, Any]) -> None:
        if self.run_pod is None:
            return
        code, log = self.run_pod(copy.deepcopy(pod))
        pod_name = pod["metadata"]["name"]
        with self.lock:
            self._logs[(ns, pod_name)] = log
            p = self._bucket("", "pods").get((ns, pod_name))
            if p is not None:
                p["status"] = {"phase": "Succeeded" if code == 0 else "Failed"}
                p["metadata"]["resourceVersion"] = self._next_rv()
            job = self._bucket("batch", "jobs").get((ns, job_name))
            if job is None:
                return
            st = job.setdefault("status", {})
            key = "succeeded" if code == 0 else "failed"
            st[key] = int(st.get(key) or 0) + 1
            done = "Complete" if st.get("succeeded") == n else "Failed" if code else None
            if done:
                st["conditions"] = [{"type": done, "status": "True", "lastTransitionTime": _now()}]
            job["metadata"]["resourceVersion"] = self._next_rv()


def write_target(path: Path, kubeconfig: Path, **fields: Any) -> Path:
    """Write a target file for the ``llm`` namespace of :func:`make_cluster` (``fields`` override)."""
    doc: dict[str, Any] = {
        "kubeconfig": str(kubeconfig),
        "context": "kind-lab",
        "namespace": "llm",
        "selector": "app=vllm",
        "container": "vllm",
        "url": "http://127.0.0.1:9/v1",
        "deployment": "vllm",
        "quota": "gpu-quota",
        "allow": {"contexts": ["kind-*"], "namespaces": ["llm"]},
    }
    doc.update(fields)
    doc = {k: v for k, v in doc.items() if v is not None}
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def _is_ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in pod.get("status", {}).get("conditions") or []
    )


def ready_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` with a Running, Ready status (conditions and containerStatuses filled in)."""
    now = _now()
    pod = copy.deepcopy(pod)
    pod["status"] = {
        "phase": "Running",
        "hostIP": "10.0.0.10",
        "podIP": f"10.244.{len(pod['metadata']['name']) % 250}.{sum(map(ord, pod['metadata']['name'])) % 250}",
        "startTime": now,
        "qosClass": "Burstable",
        "conditions": [
            {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
            for t in (
                "PodReadyToStartContainers",
                "Initialized",
                "Ready",
                "ContainersReady",
                "PodScheduled",
            )
        ],
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": f"docker.io/{c['image']}@sha256:{'ab' * 32}",
                "containerID": f"containerd://{'cd' * 32}",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
                "lastState": {},
            }
            for c in pod["spec"]["containers"]
        ],
    }
    return pod


def _model_pod(name: str, node: str, rs: str, ns: str = "llm") -> dict[str, Any]:
    return ready_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": ns,
                "generateName": f"{rs}-",
                "labels": {"app": "vllm", "pod-template-hash": rs.rsplit("-", 1)[-1]},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": rs,
                        "uid": f"uid-replicasets-{rs}",
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "nodeName": node,
                "serviceAccountName": "default",
                "containers": [
                    {
                        "name": "vllm",
                        "image": "vllm/vllm-openai:v0.6.3",
                        "args": ["--model", "/models/llama", "--port", "8000"],
                        "ports": [{"containerPort": 8000, "name": "http", "protocol": "TCP"}],
                        "resources": {
                            "limits": {"nvidia.com/gpu": "1", "memory": "24Gi"},
                            "requests": {"nvidia.com/gpu": "1", "memory": "24Gi"},
                        },
                        "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}},
                        "volumeMounts": [
                            {"name": "model-cache", "mountPath": "/models"},
                            {
                                "name": "kube-api-access-x1",
                                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                                "readOnly": True,
                            },
                        ],
                    }
                ],
                "volumes": [
                    {"name": "model-cache", "persistentVolumeClaim": {"claimName": "model-cache"}},
                    {
                        "name": "kube-api-access-x1",
                        "projected": {
                            "sources": [
                                {
                                    "serviceAccountToken": {
                                        "path": "token",
                                        "expirationSeconds": 3607,
                                    }
                                }
                            ]
                        },
                    },
                ],
            },
        }
    )


def _bad_eviction(body: Any, ns: str, name: str) -> str | None:
    """What the API server refuses (400) in an Eviction POSTed to ``pods/{name}/eviction``: not a
    ``policy/v1`` (or ``v1beta1``) Eviction, or a name/namespace other than the URL's."""
    if not isinstance(body, dict) or body.get("kind") != "Eviction":
        return "the body of pods/eviction must be an Eviction"
    if body.get("apiVersion") not in ("policy/v1", "policy/v1beta1"):
        return f"Eviction apiVersion {body.get('apiVersion')!r} is not served"
    meta = body.get("metadata") or {}
    if meta.get("name") != name:
        return f"name in URL does not match name in Eviction object: {meta.get('name')!r}"
    if meta.get("namespace") not in (None, "", ns):
        return f"the namespace of the Eviction {meta.get('namespace')!r} does not match {ns!r}"
    return None


def make_cluster(
    fake: FakeK8s, replicas: int = 3, pdb_min_available: int | None = None, hpa: str | None = None
) -> None:
    """Populate ``fake`` with a realistic GPU inference cluster.

    Nodes ``gpu-a``, ``gpu-b``, ``gpu-c`` (Ready, 2 GPUs each); namespace ``llm`` with Deployment
    ``vllm`` (``replicas``) -> ReplicaSet ``vllm-7d9f8c6b5`` -> pods ``vllm-7d9f8c6b5-<x>`` spread
    over the nodes (ownerReferences, PVC + projected volumes, conditions, containerStatuses); a
    ``node-exporter`` DaemonSet pod on every node (``monitoring``); ResourceQuota ``gpu-quota``;
    optionally a PodDisruptionBudget ``vllm-pdb`` with ``minAvailable``; Service ``vllm`` (selector
    ``app=vllm``, port 80 -> 8000) whose EndpointSlices follow the pods; optionally an
    ``autoscaling/v2`` HorizontalPodAutoscaler named ``hpa`` (e.g. KEDA's ``keda-hpa-vllm``)
    scaling the Deployment between ``replicas`` and ``replicas + 3``.
    """
    for i, node in enumerate(("gpu-a", "gpu-b", "gpu-c")):
        fake.put(
            "",
            "nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": node,
                    "labels": {
                        "kubernetes.io/hostname": node,
                        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                    },
                },
                "spec": {"podCIDR": f"10.244.{i}.0/24", "providerID": f"kind://docker/lab/{node}"},
                "status": {
                    "capacity": {
                        "cpu": "32",
                        "memory": "256Gi",
                        "nvidia.com/gpu": "2",
                        "pods": "110",
                    },
                    "allocatable": {
                        "cpu": "31",
                        "memory": "250Gi",
                        "nvidia.com/gpu": "2",
                        "pods": "110",
                    },
                    "conditions": [
                        {
                            "type": "MemoryPressure",
                            "status": "False",
                            "reason": "KubeletHasSufficientMemory",
                        },
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "lastHeartbeatTime": _now(),
                            "lastTransitionTime": _now(),
                        },
                    ],
                    "nodeInfo": {
                        "architecture": "amd64",
                        "bootID": f"boot-{node}",
                        "kernelVersion": "6.1.0-25-amd64",
                        "kubeProxyVersion": "v1.31.0",
                        "kubeletVersion": "v1.31.0",
                        "machineID": f"machine-{node}",
                        "operatingSystem": "linux",
                        "osImage": "Debian GNU/Linux 12 (bookworm)",
                        "systemUUID": f"uuid-{node}",
                        "containerRuntimeVersion": "containerd://1.7.18",
                    },
                },
            },
        )
        fake.put(
            "",
            "pods",
            ready_pod(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"node-exporter-{node}",
                        "namespace": "monitoring",
                        "labels": {"app": "node-exporter"},
                        "ownerReferences": [
                            {
                                "apiVersion": "apps/v1",
                                "kind": "DaemonSet",
                                "name": "node-exporter",
                                "uid": "uid-daemonsets-node-exporter",
                                "controller": True,
                            }
                        ],
                    },
                    "spec": {
                        "nodeName": node,
                        "containers": [
                            {"name": "node-exporter", "image": "prom/node-exporter:v1.8.2"}
                        ],
                        "volumes": [{"name": "proc", "hostPath": {"path": "/proc"}}],
                    },
                }
            ),
        )
    rs = "vllm-7d9f8c6b5"
    fake.put(
        "apps",
        "deployments",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "vllm",
                "namespace": "llm",
                "generation": 4,
                "labels": {"app": "vllm"},
                "annotations": {"deployment.kubernetes.io/revision": "3"},
            },
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "vllm"}},
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0},
                },
                "template": {
                    "metadata": {"labels": {"app": "vllm"}},
                    "spec": {
                        k: v for k, v in _model_pod("t", "x", rs)["spec"].items() if k != "nodeName"
                    },
                },
            },
            "status": {
                "replicas": replicas,
                "readyReplicas": replicas,
                "availableReplicas": replicas,
                "observedGeneration": 4,
            },
        },
    )
    fake.put(
        "apps",
        "replicasets",
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": rs,
                "namespace": "llm",
                "labels": {"app": "vllm"},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": "vllm",
                        "uid": "uid-deployments-vllm",
                        "controller": True,
                    }
                ],
            },
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "vllm"}}},
        },
    )
    nodes = ("gpu-a", "gpu-b", "gpu-c")
    for i in range(replicas):
        fake.put("", "pods", _model_pod(f"{rs}-{'xkqbz'[i % 5]}{i}p9w", nodes[i % 3], rs))
    fake.put(
        "",
        "resourcequotas",
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {
                "name": "gpu-quota",
                "namespace": "llm",
                "labels": {"team": "inference"},
                "annotations": {"owner": "platform@example.com"},
            },
            "spec": {
                "hard": {"requests.nvidia.com/gpu": "4", "limits.nvidia.com/gpu": "4", "pods": "20"}
            },
            "status": {
                "hard": {"requests.nvidia.com/gpu": "4"},
                "used": {"requests.nvidia.com/gpu": str(replicas)},
            },
        },
    )
    fake.put(
        "",
        "services",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "vllm", "namespace": "llm", "labels": {"app": "vllm"}},
            "spec": {
                "type": "ClusterIP",
                "clusterIP": "10.96.12.34",
                "selector": {"app": "vllm"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8000, "protocol": "TCP"}],
            },
        },
    )
    # the cluster starts in steady state: its EndpointSlices already list the Ready pods (the
    # endpoint controller's delay applies to later changes only, not to the initial sync)
    fake._sync_slices("llm")
    if hpa is not None:
        fake.put(
            "autoscaling",
            "horizontalpodautoscalers",
            {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": hpa, "namespace": "llm"},
                "spec": {
                    "scaleTargetRef": {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": "vllm",
                    },
                    "minReplicas": replicas,
                    "maxReplicas": replicas + 3,
                    "metrics": [
                        {
                            "type": "Pods",
                            "pods": {
                                "metric": {"name": "vllm:num_requests_waiting"},
                                "target": {"type": "AverageValue", "averageValue": "4"},
                            },
                        }
                    ],
                },
                "status": {
                    "currentReplicas": replicas,
                    "desiredReplicas": replicas,
                    "conditions": [
                        {"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale"},
                        {"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound"},
                    ],
                },
            },
        )
    if pdb_min_available is not None:
        fake.put(
            "policy",
            "poddisruptionbudgets",
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "vllm-pdb", "namespace": "llm"},
                "spec": {
                    "minAvailable": pdb_min_available,
                    "selector": {"matchLabels": {"app": "vllm"}},
                },
            },
        )
