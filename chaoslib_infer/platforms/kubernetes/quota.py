"""quota-cut on Kubernetes: lower a ResourceQuota's GPU request, a Deployment's replicas and its
HorizontalPodAutoscaler's ``maxReplicas`` (``autoscaling/v2``; ``minReplicas`` too when it would
exceed the new maximum, which the API would refuse).

The cut first stores both objects exactly as the API server returned them (the raw JSON bytes of
a GET), then patches them (``application/merge-patch+json``). The restore replaces each object with
its stored body minus ``metadata.resourceVersion`` (PUT: an unconditional update, so a change the
controllers made meanwhile, e.g. to ``status``, does not make it fail), which puts back every
field of ``metadata`` (labels, annotations), ``spec`` byte-for-byte as stored. The PUT is sent as
raw JSON (:func:`~chaoslib_infer.platforms.kubernetes.request_json`): the typed
``replace_namespaced_*`` methods would first validate the body into a model class, rewriting
timestamps (``...Z`` -> ``...+00:00``) and dropping fields the client version does not know.
"""

from __future__ import annotations

import json
from typing import Any

from chaoslib_infer.platforms.kubernetes import K8sError, call, call_bytes, request_json

__all__ = ["GPU_QUOTA_KEY", "cut", "restore", "snapshot"]

#: The quota key for GPUs requested through the NVIDIA device plugin.
GPU_QUOTA_KEY = "requests.nvidia.com/gpu"
_MERGE = "application/merge-patch+json"


def _autoscaling(core: Any) -> Any:
    from kubernetes import client

    return client.AutoscalingV2Api(core.api_client)


def snapshot(
    core: Any,
    apps: Any,
    namespace: str,
    quota: str | None,
    deployment: str | None,
    hpa: str | None = None,
    hpa_optional: bool = False,
    hpa_target: str | None = None,
) -> dict[str, Any]:
    """The raw stored form of the quota, the deployment and the HPA (the bodies the restore PUTs).

    Args:
        core, apps: ``CoreV1Api``, ``AppsV1Api``. namespace: theirs.
        quota, deployment, hpa: object names (None: not part of the cut).
        hpa_optional: an absent HPA (404) is recorded as skipped instead of an error (its name
            was guessed from the Deployment's, not given).
        hpa_target: the Deployment the HPA must scale (default ``deployment``).

    Returns:
        ``{"namespace", "quota": {"name", "raw"} | None, "deployment": {"name", "raw"} | None,
        "hpa": {"name", "raw"} | None, "hpa_skipped": str | None}`` with ``raw`` the exact JSON
        text the API server sent.

    Raises:
        K8sError: an object is absent (404) or unreadable (403); none named; the HPA scales
            another object than ``deployment``.
    """
    if not quota and not deployment and not hpa:
        raise K8sError("quota-cut needs a ResourceQuota, a Deployment or an HPA name")
    out: dict[str, Any] = {
        "namespace": namespace,
        "quota": None,
        "deployment": None,
        "hpa": None,
        "hpa_skipped": None,
    }

    def read(kind: str, name: str, reader: Any) -> bytes:
        return call_bytes(f"get {kind} {namespace}/{name}", reader, name, namespace)

    if quota:
        raw = read("resourcequota", quota, core.read_namespaced_resource_quota)
        out["quota"] = {"name": quota, "raw": raw.decode("utf-8")}
    if deployment:
        raw = read("deployment", deployment, apps.read_namespaced_deployment)
        out["deployment"] = {"name": deployment, "raw": raw.decode("utf-8")}
    if hpa:
        try:
            raw = read(
                "horizontalpodautoscaler",
                hpa,
                _autoscaling(core).read_namespaced_horizontal_pod_autoscaler,
            )
        except K8sError as exc:
            if exc.status != 404 or not hpa_optional:
                raise
            out["hpa_skipped"] = f"no HorizontalPodAutoscaler {namespace}/{hpa}"
        else:
            ref = (json.loads(raw).get("spec") or {}).get("scaleTargetRef") or {}
            owner = hpa_target or deployment
            if owner and (ref.get("kind"), ref.get("name")) != ("Deployment", owner):
                raise K8sError(
                    f"horizontalpodautoscaler {namespace}/{hpa} scales {ref.get('kind')} "
                    f"{ref.get('name')}, not Deployment {owner}"
                )
            out["hpa"] = {"name": hpa, "raw": raw.decode("utf-8")}
    return out


def cut(
    core: Any,
    apps: Any,
    saved: dict[str, Any],
    gpus: int | None,
    replicas: int | None,
    hpa_max_replicas: int | None = None,
) -> dict[str, Any]:
    """Apply the cut described by ``gpus`` / ``replicas`` to the objects in ``saved``.

    Args:
        core, apps: ``CoreV1Api``, ``AppsV1Api``.
        saved: from :func:`snapshot` (store it durably *before* calling this).
        gpus: new ``requests.nvidia.com/gpu`` hard limit (None: leave the quota alone).
        replicas: new ``spec.replicas`` of the Deployment (None: leave it alone).
        hpa_max_replicas: new ``spec.maxReplicas`` of the HPA (None: leave it alone; ignored
            when the HPA was skipped by :func:`snapshot`).

    Returns:
        ``{"quota": {"name", "before", "after"} | None, "deployment": {...} | None,
        "hpa": {"name", "before", "after", "min_before", "min_after"} | None}``
        (before/after: the GPU hard limit string, the replica count, ``maxReplicas``).

    Raises:
        K8sError: a patch failed (403/404...), or a value is asked for an object not in ``saved``.
    """
    ns = saved["namespace"]
    out: dict[str, Any] = {"quota": None, "deployment": None, "hpa": None}

    def patch(kind: str, name: str, patcher: Any, spec: dict[str, Any]) -> Any:
        return call(
            f"patch {kind} {ns}/{name}", patcher, name, ns, {"spec": spec}, _content_type=_MERGE
        )

    if gpus is not None:
        if not saved.get("quota"):
            raise K8sError("a GPU quota cut needs the ResourceQuota name (target 'quota:')")
        if gpus < 0:
            raise K8sError(f"gpus must be >= 0, got {gpus}")
        name = saved["quota"]["name"]
        before = (
            (json.loads(saved["quota"]["raw"]).get("spec") or {}).get("hard", {}).get(GPU_QUOTA_KEY)
        )
        doc = patch(
            "resourcequota",
            name,
            core.patch_namespaced_resource_quota,
            {"hard": {GPU_QUOTA_KEY: str(gpus)}},
        )
        out["quota"] = {
            "name": name,
            "before": before,
            "after": doc["spec"]["hard"].get(GPU_QUOTA_KEY),
        }
    if replicas is not None:
        if not saved.get("deployment"):
            raise K8sError("a replica cut needs the Deployment name (target 'deployment:')")
        if replicas < 0:
            raise K8sError(f"replicas must be >= 0, got {replicas}")
        name = saved["deployment"]["name"]
        before = (json.loads(saved["deployment"]["raw"]).get("spec") or {}).get("replicas")
        doc = patch(
            "deployment", name, apps.patch_namespaced_deployment, {"replicas": int(replicas)}
        )
        out["deployment"] = {"name": name, "before": before, "after": doc["spec"].get("replicas")}
    if hpa_max_replicas is not None and saved.get("hpa"):
        if hpa_max_replicas < 1:
            raise K8sError(f"hpa_max_replicas must be >= 1, got {hpa_max_replicas}")
        name = saved["hpa"]["name"]
        spec = json.loads(saved["hpa"]["raw"]).get("spec") or {}
        hpa_patch: dict[str, Any] = {"maxReplicas": int(hpa_max_replicas)}
        min_before = spec.get("minReplicas", 1)
        if hpa_max_replicas < min_before:
            hpa_patch["minReplicas"] = int(hpa_max_replicas)
        doc = patch(
            "horizontalpodautoscaler",
            name,
            _autoscaling(core).patch_namespaced_horizontal_pod_autoscaler,
            hpa_patch,
        )
        out["hpa"] = {
            "name": name,
            "before": spec.get("maxReplicas"),
            "after": doc["spec"].get("maxReplicas"),
            "min_before": min_before,
            "min_after": doc["spec"].get("minReplicas", 1),
        }
    elif hpa_max_replicas is not None and not saved.get("hpa_skipped"):
        raise K8sError("an HPA cut needs the HorizontalPodAutoscaler (target 'hpa:')")
    return out


def _body(raw: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(raw)
    body.get("metadata", {}).pop("resourceVersion", None)
    return body


def restore(core: Any, apps: Any, saved: dict[str, Any]) -> list[str]:
    """PUT back the stored objects (resourceVersion-free) and check that they read back equal.

    Returns:
        One line per restored object (``"resourcequota llm/gpu-quota restored"``).

    Raises:
        K8sError: a PUT failed (403, 404 when the object was deleted meanwhile), or the object
            read back differs from the stored one in ``metadata.labels``, ``annotations`` or
            ``spec``.
    """
    ns = saved["namespace"]
    done = []
    for key, kind, prefix, get in (
        (
            "quota",
            "resourcequota",
            f"/api/v1/namespaces/{ns}/resourcequotas",
            core.read_namespaced_resource_quota,
        ),
        (
            "hpa",
            "horizontalpodautoscaler",
            f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers",
            _autoscaling(core).read_namespaced_horizontal_pod_autoscaler,
        ),
        (
            "deployment",
            "deployment",
            f"/apis/apps/v1/namespaces/{ns}/deployments",
            apps.read_namespaced_deployment,
        ),
    ):
        item = saved.get(key)
        if not item:
            continue
        name, body = item["name"], _body(item["raw"])
        request_json(
            core.api_client, f"replace {kind} {ns}/{name}", "PUT", f"{prefix}/{name}", body
        )
        back = call(f"get {kind} {ns}/{name}", get, name, ns)
        for part in ("spec",):
            if back.get(part) != body.get(part):
                raise K8sError(
                    f"{kind} {ns}/{name}: {part} read back differs from the stored object after restore"
                )
        for part in ("labels", "annotations"):
            if (back.get("metadata") or {}).get(part) != (body.get("metadata") or {}).get(part):
                raise K8sError(
                    f"{kind} {ns}/{name}: metadata.{part} read back differs after restore"
                )
        done.append(f"{kind} {ns}/{name} restored")
    return done
