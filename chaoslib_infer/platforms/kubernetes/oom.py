"""oom-kill on Kubernetes: a memory hog exec'd into the model-server container.

The hog (:data:`~chaoslib_infer.platforms.kubernetes.scripts.HOG`) runs *inside* the container, so
it is charged to the container's own memory cgroup: once the cgroup reaches the container's
``resources.limits.memory``, the kernel's OOM killer kills a process of that cgroup. The hog makes
the model server the victim (its own ``oom_score_adj`` -1000 where allowed, else the other
processes +1000), as a real leak in the server would; on cgroup v2 with ``memory.oom.group`` (the
kubelet's default since 1.28) the whole container is killed anyway. The container runtime then
reports ``lastState.terminated.reason: OOMKilled`` and the kubelet restarts the container in place
(``restartCount`` + 1).

A container without a memory limit is refused: its cgroup has no limit of its own, so a hog would
press on the whole node instead (other pods), which this drill must not do.

Figures (:func:`watch_restart`) are observed by polling the pod (``poll_s``, so each is precise to
one poll interval); the API's own timestamps (one-second resolution, the kubelet's clock) are kept
beside them for cross-checking.
"""

from __future__ import annotations

import math
import time
from typing import Any

from chaoslib_infer.platforms.kubernetes import K8sError, call
from chaoslib_infer.platforms.kubernetes import scripts as S
from chaoslib_infer.platforms.kubernetes.exec import run_script
from chaoslib_infer.platforms.kubernetes.observe.common import k8s_time
from chaoslib_infer.platforms.kubernetes.pods import read_pod_if_present
from chaoslib_infer.safety.redact import clip

__all__ = [
    "container_status",
    "default_hog_mb",
    "memory_limit_bytes",
    "start_hog",
    "stop_hog",
    "watch_restart",
]

MIB = 1 << 20


def memory_limit_bytes(pod: dict[str, Any], container: str) -> int | None:
    """``resources.limits.memory`` of ``container`` in the pod spec, in bytes (None when unset).

    Raises:
        K8sError: the container is not in the pod spec, or the quantity is malformed.
    """
    from kubernetes.utils.quantity import parse_quantity

    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == container:
            raw = ((c.get("resources") or {}).get("limits") or {}).get("memory")
            if raw is None:
                return None
            try:
                return int(parse_quantity(raw))
            except ValueError:
                raise K8sError(f"container {container}: bad memory limit {raw!r}") from None
    raise K8sError(f"pod {pod['metadata']['name']} has no container {container!r}", 404)


def default_hog_mb(limit_bytes: int) -> int:
    """The hog's default size: the container's memory limit plus 10% plus 64 MiB, in MiB.

    The hog alone then exceeds the limit, whatever the model server itself uses.
    """
    return math.ceil(limit_bytes * 1.1 / MIB) + 64


def container_status(pod: dict[str, Any], container: str) -> dict[str, Any]:
    """``status.containerStatuses[name=container]`` ({} when absent)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container:
            return dict(cs)
    return {}


def start_hog(
    core: Any, namespace: str, pod: str, container: str, hog_mb: int, ttl_s: float
) -> dict[str, Any]:
    """Start the detached hog in the container (one exec; returns once it runs).

    Returns:
        ``{"interpreter", "pid", "start", "oom_score_mode", "cgroup_limit"}`` (pid/start as seen
        in the container; ``cgroup_limit`` as the container reads it, or "-").

    Raises:
        K8sError: exec refused (403/404), no interpreter, or the hog did not start.
    """
    used, res = run_script(core, namespace, pod, container, S.HOG, [str(hog_mb), f"{ttl_s:g}"])
    line = next((ln.split() for ln in res.lines if ln.startswith("hog ")), None)
    if res.exit_code != 0 or line is None or len(line) < 5:
        raise K8sError(
            f"memory hog in pod {namespace}/{pod} did not start (exit {res.exit_code}): "
            f"{clip((res.stderr or res.message or res.stdout).strip(), 200)}"
        )
    return {
        "interpreter": used,
        "pid": int(line[1]),
        "start": line[2],
        "oom_score_mode": line[3],
        "cgroup_limit": line[4],
    }


def stop_hog(core: Any, saved: dict[str, Any]) -> str:
    """Kill the hog recorded in ``saved`` if it still runs (idempotent).

    Args:
        saved: ``{"namespace", "pod", "container", "container_id", "hog": {"interpreter", "pid",
            "start"}}``.

    Returns:
        One line saying what was done.

    Raises:
        K8sError: the pod could not be read (403) or the exec failed. A pod that is gone (404)
            or a container that restarted since (the hog died with it) is not an error.
    """
    ns, pod, container = saved["namespace"], saved["pod"], saved["container"]
    hog = saved["hog"]
    doc = read_pod_if_present(core, ns, pod)
    if doc is None:
        return f"pod {ns}/{pod} is gone; the hog went with it"
    cs = container_status(doc, container)
    if cs.get("containerID") != saved.get("container_id") or "running" not in (
        cs.get("state") or {}
    ):
        return f"container {container} of pod {ns}/{pod} restarted; the hog died with it"
    _, res = run_script(
        core,
        ns,
        pod,
        container,
        S.KILL_TREE,
        [str(hog["pid"]), str(hog["start"])],
        hog["interpreter"],
    )
    killed = [ln.split()[1] for ln in res.lines if ln.startswith("killed ")]
    if res.exit_code != 0:
        raise K8sError(
            f"stopping the hog in pod {ns}/{pod} failed (exit {res.exit_code}): "
            f"{clip((res.stderr or res.message).strip(), 200)}"
        )
    if killed:
        return f"memory hog {', '.join(killed)} killed in pod {ns}/{pod}"
    return f"memory hog {hog['pid']} in pod {ns}/{pod} had already ended"


def watch_restart(
    core: Any,
    namespace: str,
    pod: str,
    container: str,
    restart_count_before: int,
    container_id_before: str | None,
    fault_at: float,
    timeout_s: float,
    poll_s: float,
) -> dict[str, Any]:
    """Poll the pod until the container died, was restarted and is Ready again (or ``timeout_s``).

    The death is seen either as ``state.terminated`` of the old container or, when the kubelet
    restarted it between two polls, as ``restartCount`` > before with ``lastState.terminated``.

    Args:
        core: ``CoreV1Api``. namespace, pod, container: the target.
        restart_count_before, container_id_before: the container's status before the hog.
        fault_at: when the hog started (unix s).
        timeout_s: bound on the whole wait from now, seconds. poll_s: polling interval, seconds.

    Returns:
        ``{"died": bool, "reason", "exit_code", "restart_count_after", "oom_at", "running_at",
        "ready_at" (unix s, observed), "finished_at_api", "started_at_api" (the API's
        timestamps), "time_to_oom_s", "restart_s" (death -> running), "ready_s" (death ->
        Ready), "api_restart_s" (finishedAt -> startedAt), "polls"}``; None where not reached.

    Raises:
        K8sError: the pod could not be read (403, 404 when it was deleted meanwhile).
    """
    out: dict[str, Any] = {
        "died": False,
        "reason": None,
        "exit_code": None,
        "restart_count_after": restart_count_before,
        "oom_at": None,
        "running_at": None,
        "ready_at": None,
        "finished_at_api": None,
        "started_at_api": None,
        "polls": 0,
    }
    deadline = time.monotonic() + timeout_s
    while True:
        out["polls"] += 1
        doc = call(f"get pod {namespace}/{pod}", core.read_namespaced_pod, pod, namespace)
        now = time.time()
        cs = container_status(doc, container)
        count = int(cs.get("restartCount") or 0)
        state = cs.get("state") or {}
        out["restart_count_after"] = count
        term = None
        if count > restart_count_before:
            term = (cs.get("lastState") or {}).get("terminated")
        elif "terminated" in state and cs.get("containerID") == container_id_before:
            term = state["terminated"]
        if out["oom_at"] is None and (term is not None or count > restart_count_before):
            out["died"], out["oom_at"] = True, now
            out["reason"] = (term or {}).get("reason")
            out["exit_code"] = (term or {}).get("exitCode")
            out["finished_at_api"] = k8s_time((term or {}).get("finishedAt"))
        if out["oom_at"] is not None and count > restart_count_before:
            if term is not None and out["reason"] is None:
                out["reason"], out["exit_code"] = term.get("reason"), term.get("exitCode")
                out["finished_at_api"] = k8s_time(term.get("finishedAt"))
            if out["running_at"] is None and "running" in state:
                out["running_at"] = now
                out["started_at_api"] = k8s_time(state["running"].get("startedAt"))
            if out["running_at"] is not None and out["ready_at"] is None and cs.get("ready"):
                out["ready_at"] = now
        if out["ready_at"] is not None or time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    died, running, ready = out["oom_at"], out["running_at"], out["ready_at"]
    out["time_to_oom_s"] = round(died - fault_at, 3) if died is not None else None
    out["restart_s"] = round(running - died, 3) if running is not None and died else None
    out["ready_s"] = round(ready - died, 3) if ready is not None and died else None
    fin, sta = out["finished_at_api"], out["started_at_api"]
    out["api_restart_s"] = round(sta - fin, 3) if fin is not None and sta is not None else None
    return out
