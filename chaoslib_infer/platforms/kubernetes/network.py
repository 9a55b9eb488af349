"""network-jitter on Kubernetes: netem in the pod's network namespace via an ephemeral container.

An ephemeral container shares the pod's network namespace, so ``tc qdisc add dev eth0 root netem
delay <ms> <jitter> [loss]`` run there (with ``CAP_NET_ADMIN``) shapes all of the pod's egress on
``eth0``. ``tc`` exits at once; the qdisc stays. The argument list comes from
:func:`chaoslib_infer.lab.netem.netem_add_args` (the same builder as the lab drill).

Caveats (also in ``docs/kubernetes.md``):

- Ephemeral containers **cannot be removed** from a pod; they stay listed (terminated) in
  ``spec.ephemeralContainers`` until the pod is replaced. The rollback therefore adds a *second*
  ephemeral container that runs ``tc qdisc del dev eth0 root``.
- Pod Security admission refuses the ``NET_ADMIN`` capability under the ``baseline`` and
  ``restricted`` levels (403 ``violates PodSecurity``); such namespaces need Chaos Mesh's
  ``NetworkChaos`` (its daemon applies netem from the node) or an exemption.
- The image must contain ``tc`` (iproute2) and run as root; the default is ``nicolaka/netshoot``.
- ``terminationMessagePolicy: FallbackToLogsOnError`` puts tc's stderr in the container's
  termination message, so a failure is reported without ``pods/log`` permission.
"""

from __future__ import annotations

import time
from typing import Any

from chaoslib_infer.lab.netem import netem_add_args, netem_del_args
from chaoslib_infer.platforms.kubernetes import K8sError, call

__all__ = ["DEFAULT_IMAGE", "add_ephemeral", "ephemeral_netem_spec", "wait_ephemeral"]

#: An image with iproute2's ``tc`` that runs as root.
DEFAULT_IMAGE = "nicolaka/netshoot:v0.13"
_STRATEGIC = "application/strategic-merge-patch+json"


def ephemeral_netem_spec(
    name: str,
    delay_ms: float,
    jitter_ms: float,
    loss_pct: float = 0.0,
    image: str = DEFAULT_IMAGE,
    dev: str = "eth0",
    remove: bool = False,
) -> dict[str, Any]:
    """The ``EphemeralContainer`` (API dict) adding (or, with ``remove``, deleting) the netem qdisc.

    Args:
        name: container name, unique within the pod.
        delay_ms, jitter_ms, loss_pct: see :func:`chaoslib_infer.lab.netem.tc_netem_args`.
        image: image with ``tc``.
        dev: the pod's interface.
        remove: run ``tc qdisc del dev DEV root`` instead.

    Returns:
        ``{"name", "image", "command", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]},
        "runAsUser": 0, "runAsNonRoot": False}, "terminationMessagePolicy", "stdin", "tty"}``.

    Raises:
        ValueError: bad netem values or device name (from the tc builder).
    """
    command = netem_del_args(dev) if remove else netem_add_args(dev, delay_ms, jitter_ms, loss_pct)
    return {
        "name": name,
        "image": image,
        "command": command,
        "securityContext": {
            "capabilities": {"add": ["NET_ADMIN"]},
            "runAsUser": 0,
            "runAsNonRoot": False,
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "stdin": False,
        "tty": False,
    }


def add_ephemeral(core: Any, namespace: str, pod: str, spec: dict[str, Any]) -> dict[str, Any]:
    """PATCH ``spec`` into the pod's ``ephemeralcontainers`` subresource (strategic merge by name).

    Returns:
        The pod as the API returned it.

    Raises:
        K8sError: 404 pod absent; 403 missing ``pods/ephemeralcontainers`` permission or a Pod
            Security refusal (the message says which).
    """
    try:
        return dict(
            call(
                f"add ephemeral container {spec['name']} to pod {namespace}/{pod}",
                core.patch_namespaced_pod_ephemeralcontainers,
                pod,
                namespace,
                {"spec": {"ephemeralContainers": [spec]}},
                _content_type=_STRATEGIC,
            )
        )
    except K8sError as exc:
        if exc.status == 403 and "PodSecurity" in str(exc):
            raise K8sError(
                f"pod {namespace}/{pod}: Pod Security admission refuses NET_ADMIN in namespace "
                f"{namespace} (use Chaos Mesh NetworkChaos, or a namespace at 'privileged'): {exc}",
                403,
            ) from None
        raise


def wait_ephemeral(
    core: Any, namespace: str, pod: str, name: str, timeout_s: float = 60.0, poll_s: float = 0.5
) -> dict[str, Any]:
    """Wait for ephemeral container ``name`` to terminate; return its terminated state.

    Returns:
        ``{"exit_code", "reason", "message"}`` (message: tc's stderr when it failed).

    Raises:
        K8sError: the container did not terminate within ``timeout_s`` (image pull, scheduling...),
            naming its waiting reason.
    """
    deadline = time.monotonic() + timeout_s
    waiting = "not started"
    while True:
        doc = call(f"get pod {namespace}/{pod}", core.read_namespaced_pod, pod, namespace)
        for st in (doc.get("status") or {}).get("ephemeralContainerStatuses") or []:
            if st.get("name") != name:
                continue
            state = st.get("state") or {}
            if "terminated" in state:
                term = state["terminated"]
                return {
                    "exit_code": term.get("exitCode"),
                    "reason": term.get("reason"),
                    "message": (term.get("message") or "").strip(),
                }
            waiting = (state.get("waiting") or {}).get("reason") or (
                "running" if "running" in state else waiting
            )
        if time.monotonic() >= deadline:
            raise K8sError(
                f"ephemeral container {name} in pod {namespace}/{pod} did not finish within {timeout_s:g} s ({waiting})"
            )
        time.sleep(poll_s)
