"""An HTTP-level fake Kubernetes API server for the Kubernetes action tests.

The official ``kubernetes`` client talks to it over real HTTP on 127.0.0.1 (port 0 = a free port),
through a kubeconfig written by :meth:`FakeK8s.write_kubeconfig`. It keeps objects in memory and
implements what the actions use, the way the real API server answers:

- GET / LIST (``labelSelector`` with ``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``, ``!key``;
  ``fieldSelector`` on ``spec.nodeName``, ``metadata.name``, ``metadata.namespace``,
  ``status.phase``), POST, PUT (unconditional or with a matching ``resourceVersion``, else 409),
  PATCH (``application/merge-patch+json`` per RFC 7386 and ``application/strategic-merge-patch+json``
  with merge-by-name for container lists), DELETE; ``/api/v1/pods`` across namespaces;
- ``pods/eviction`` (POST): 429 ``TooManyRequests`` when a PodDisruptionBudget selecting the pod
  allows no disruption, else the pod is deleted (201 Status Success);
- ``pods/ephemeralcontainers`` (PATCH): the new containers get a terminated status with exit code 0
  (as ``tc`` exits at once); 403 when :attr:`FakeK8s.pod_security` is ``"baseline"`` or
  ``"restricted"`` and a container adds a capability (the Pod Security admission message);
- a ReplicaSet "controller": a deleted or evicted pod owned by a ReplicaSet is replaced by a new pod
  (Pending, then scheduled on a schedulable node after ``schedule_delay_s``, then Ready after
  ``ready_delay_s`` more), as the real controller and scheduler would;
- :meth:`FakeK8s.forbid` answers 403 for a (verb, resource) pair, as RBAC would.

Every request is recorded in :attr:`FakeK8s.requests` (method, path, query, body, content type,
status) so tests assert the exact calls.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

__all__ = ["ALL_REQUESTS", "FakeK8s", "Request", "make_cluster", "ready_pod", "write_target"]

#: Every request any FakeK8s of this test session received (for the RBAC coverage test).
ALL_REQUESTS: list[Request] = []

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
}
_CLUSTER_SCOPED = {"nodes"}
_MERGE_BY_NAME = {"containers", "ephemeralContainers", "initContainers", "volumes", "env"}
_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


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

    def __init__(self, schedule_delay_s: float = 0.2, ready_delay_s: float = 0.3) -> None:
        self.objects: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}
        self.requests: list[Request] = []
        self.forbidden: set[tuple[str, str]] = set()
        self.pod_security = "privileged"
        self.ephemeral_result: tuple[int, str] = (0, "")  # (exitCode, termination message)
        self.schedule_delay_s = schedule_delay_s
        self.ready_delay_s = ready_delay_s
        self.lock = threading.RLock()
        self._rv = 1000
        self._seq = 0
        self._timers: list[threading.Timer] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeK8s:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for t in self._timers:
            t.cancel()
        ALL_REQUESTS.extend(self.requests)
        self._server.shutdown()
        self._server.server_close()

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
            self._later(self.ready_delay_s, ready)

        def ready() -> None:
            with self.lock:
                p = self._bucket("", "pods").get((ns, name))
                if p is None:
                    return
                p["status"] = ready_pod(p)["status"]
                p["metadata"]["resourceVersion"] = self._next_rv()

        self._later(self.schedule_delay_s, schedule)

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

    # -- HTTP ------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _serve(self) -> None:
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
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
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
        if (verb, req.resource) in self.forbidden:
            where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
            return 403, _status(
                403,
                "Forbidden",
                f'{resource} "{name or ""}" is forbidden: User "system:serviceaccount:chaos:'
                f'chaos-infer" cannot {verb} resource "{req.resource}" in API group "{group}"{where}',
            )
        if resource not in _KINDS:
            return 404, _status(404, "NotFound", f"the server could not find resource {resource}")
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
                    "apiVersion": f"{group}/v1" if group else "v1",
                    "metadata": {"resourceVersion": str(self._rv)},
                    "items": items,
                }
            if req.method == "POST":
                obj = copy.deepcopy(req.body)
                obj["metadata"].setdefault("namespace", ns)
                if (key_ns, obj["metadata"]["name"]) in bucket:
                    return 409, _status(
                        409,
                        "AlreadyExists",
                        f'{resource} "{obj["metadata"]["name"]}" already exists',
                    )
                return 201, self.put(group, resource, obj)
            return 405, _status(405, "MethodNotAllowed", "method not allowed")
        current = bucket.get((key_ns, name))
        if current is None:
            return 404, _status(
                404, "NotFound", f'{resource} "{name}" not found', name=name, kind=resource
            )
        if sub == "eviction" and req.method == "POST":
            refusal = self._pdb_refusal(current)
            if refusal is not None:
                return 429, refusal
            del bucket[(key_ns, name)]
            self._on_pod_gone(current)
            return 201, _status(201, "", "", name=name, kind="pods") | {"status": "Success"}
        if sub not in (None, "ephemeralcontainers", "status"):
            return 404, _status(404, "NotFound", f"no subresource {sub}")
        if req.method == "GET":
            return 200, copy.deepcopy(current)
        if req.method == "DELETE":
            del bucket[(key_ns, name)]
            if resource == "pods":
                self._on_pod_gone(current)
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
            return 200, copy.deepcopy(patched)
        return 405, _status(405, "MethodNotAllowed", "method not allowed")


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


def make_cluster(fake: FakeK8s, replicas: int = 3, pdb_min_available: int | None = None) -> None:
    """Populate ``fake`` with a realistic GPU inference cluster.

    Nodes ``gpu-a``, ``gpu-b``, ``gpu-c`` (Ready, 2 GPUs each); namespace ``llm`` with Deployment
    ``vllm`` (``replicas``) -> ReplicaSet ``vllm-7d9f8c6b5`` -> pods ``vllm-7d9f8c6b5-<x>`` spread
    over the nodes (ownerReferences, PVC + projected volumes, conditions, containerStatuses); a
    ``node-exporter`` DaemonSet pod on every node (``monitoring``); ResourceQuota ``gpu-quota``;
    optionally a PodDisruptionBudget ``vllm-pdb`` with ``minAvailable``.
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
