"""upstream-timeout on Kubernetes, network variant: a NetworkPolicy that drops one pod's ingress.

The chosen pod gets a unique label (:data:`BLOCK_LABEL` = a token); a ``networking.k8s.io/v1``
NetworkPolicy selecting that label with ``policyTypes: [Ingress]`` and no ingress rule denies every
new inbound connection to it. The pod stays Ready in most CNIs (kubelet probes come from the node,
which Calico and Cilium allow by default), so the Service keeps sending it traffic that now hangs:
a wedged upstream, seen from its clients.

Needs a CNI that **enforces** NetworkPolicy (Calico, Cilium, Antrea, ...; kindnet and flannel alone
do not: the policy is then accepted and does nothing). The labels of the pod are stored exactly
before the change; :func:`unblock` deletes the policy (only if it is still the one this drill
created) and puts the labels back exactly as they were.
"""

from __future__ import annotations

from typing import Any

from chaoslib_infer.platforms.kubernetes import K8sError, call

__all__ = ["BLOCK_LABEL", "MANAGED_BY", "block", "policy_body", "unblock"]

#: Label put on the blocked pod; its value is the drill's token.
BLOCK_LABEL = "chaos-infer.io/block-ingress"
#: ``app.kubernetes.io/managed-by`` value on the policy (checked before deleting it).
MANAGED_BY = "chaos-infer"
_MERGE = "application/merge-patch+json"


def policy_body(name: str, namespace: str, token: str) -> dict[str, Any]:
    """The deny-all-ingress NetworkPolicy for the pod labelled ``BLOCK_LABEL=token``."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": MANAGED_BY, BLOCK_LABEL: token},
        },
        "spec": {"podSelector": {"matchLabels": {BLOCK_LABEL: token}}, "policyTypes": ["Ingress"]},
    }


def block(
    core: Any, net: Any, namespace: str, pod: str, token: str, saved: dict[str, Any]
) -> dict[str, Any]:
    """Label the pod with the token, then create the policy (``saved`` must already be stored).

    Args:
        core, net: ``CoreV1Api``, ``NetworkingV1Api``.
        namespace, pod: the target pod.
        token: unique value for :data:`BLOCK_LABEL` (a valid label value).
        saved: the state stored before (``{"policy", "labels"...}``); unused keys ignored.

    Returns:
        ``{"pod", "policy", "label": {key: token}, "labelled_at", "created_at"}`` (unix s).

    Raises:
        K8sError: 403 (pods patch / networkpolicies create), 404 pod absent, 409 a policy of
            that name exists.
    """
    import time

    call(
        f"label pod {namespace}/{pod}",
        core.patch_namespaced_pod,
        pod,
        namespace,
        {"metadata": {"labels": {BLOCK_LABEL: token}}},
        _content_type=_MERGE,
    )
    labelled_at = time.time()
    call(
        f"create networkpolicy {namespace}/{saved['policy']}",
        net.create_namespaced_network_policy,
        namespace,
        policy_body(saved["policy"], namespace, token),
    )
    return {
        "pod": pod,
        "policy": saved["policy"],
        "label": {BLOCK_LABEL: token},
        "labelled_at": labelled_at,
        "created_at": time.time(),
    }


def unblock(core: Any, net: Any, saved: dict[str, Any]) -> list[str]:
    """Delete the policy (if it is still ours) and restore the pod's labels exactly.

    Args:
        core, net: ``CoreV1Api``, ``NetworkingV1Api``.
        saved: ``{"namespace", "pod", "policy", "token", "labels"}`` (labels: the pod's
            ``metadata.labels`` before the drill, exactly).

    Returns:
        One line per step.

    Raises:
        K8sError: 403; a policy of that name that this drill did not create (left alone); the
            labels read back differ from the stored ones.
    """
    ns, pod, name, token = saved["namespace"], saved["pod"], saved["policy"], saved["token"]
    done = []
    try:
        doc = call(f"get networkpolicy {ns}/{name}", net.read_namespaced_network_policy, name, ns)
    except K8sError as exc:
        if exc.status != 404:
            raise
        done.append(f"networkpolicy {ns}/{name} already gone")
    else:
        labels = (doc.get("metadata") or {}).get("labels") or {}
        if labels.get(BLOCK_LABEL) != token or labels.get("app.kubernetes.io/managed-by") != (
            MANAGED_BY
        ):
            raise K8sError(
                f"networkpolicy {ns}/{name} is not the one this drill created "
                f"(labels {labels}); left alone"
            )
        try:
            call(
                f"delete networkpolicy {ns}/{name}", net.delete_namespaced_network_policy, name, ns
            )
            done.append(f"networkpolicy {ns}/{name} deleted")
        except K8sError as exc:
            if exc.status != 404:
                raise
            done.append(f"networkpolicy {ns}/{name} already gone")
    try:
        current = call(f"get pod {ns}/{pod}", core.read_namespaced_pod, pod, ns)
    except K8sError as exc:
        if exc.status != 404:
            raise
        return [*done, f"pod {ns}/{pod} is gone; no labels to restore"]
    want: dict[str, str] = saved["labels"] or {}
    have: dict[str, str] = (current.get("metadata") or {}).get("labels") or {}
    patch: dict[str, Any] = {k: None for k in have if k not in want}
    patch.update({k: v for k, v in want.items() if have.get(k) != v})
    if patch:
        back = call(
            f"restore labels of pod {ns}/{pod}",
            core.patch_namespaced_pod,
            pod,
            ns,
            {"metadata": {"labels": patch}},
            _content_type=_MERGE,
        )
        if ((back.get("metadata") or {}).get("labels") or {}) != want:
            raise K8sError(f"pod {ns}/{pod}: labels read back differ from the stored ones")
        done.append(f"labels of pod {ns}/{pod} restored")
    else:
        done.append(f"labels of pod {ns}/{pod} already as before")
    return done
