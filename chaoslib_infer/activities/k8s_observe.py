"""Chaos Toolkit activities observing a Kubernetes target during a drill (issue 4).

- :func:`k8s_start_observation` / :func:`k8s_stop_observation` (its rollback): a background
  sampler writing ``<run dir>/k8s-observations.jsonl`` (ready endpoints, pod restarts and OOM
  kills, node readiness, events, HPA; format in :mod:`chaoslib_infer.platforms.kubernetes.observe`).
  The evidence (``evidence/kinds/k8s_observation.py``) turns the file into figures and a plot.
- probes for a steady-state hypothesis: :func:`k8s_ready_endpoints`, :func:`k8s_restart_counts`,
  :func:`k8s_oomkilled_pods`;
- traffic-spike: :func:`k8s_wait_scale_out`, the time from the spike to new pods created, Ready,
  and serving (a ready endpoint in the Service's EndpointSlices).

The target is resolved as in :mod:`chaoslib_infer.activities.k8s` (``target_file``, else
``infer_k8s_target``, else ``$CHAOS_INFER_K8S_TARGET``), allowlist enforced before any API call.
Expected failures raise one ``ActivityFailed`` line.
"""

from __future__ import annotations

import time
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer import settings
from chaoslib_infer.platforms.kubernetes import K8sError, clients
from chaoslib_infer.platforms.kubernetes import observe as obs
from chaoslib_infer.platforms.kubernetes.activity import k8s_context, log_fault
from chaoslib_infer.platforms.kubernetes.pods import list_pods

__all__ = [
    "k8s_oomkilled_pods",
    "k8s_ready_endpoints",
    "k8s_restart_counts",
    "k8s_start_observation",
    "k8s_stop_observation",
    "k8s_wait_scale_out",
]


def k8s_start_observation(
    interval_s: float = 1.0,
    max_duration_s: float = obs.DEFAULT_MAX_DURATION_S,
    target_file: str | None = None,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Start sampling the target every ``interval_s`` into ``<run dir>/k8s-observations.jsonl``.

    The first sample is taken before returning (so a missing permission on the pods shows here);
    then a daemon thread samples until :func:`k8s_stop_observation` (put it in the rollbacks),
    ``max_duration_s``, or interpreter exit. A read refused later (e.g. 403 on events) is recorded
    in that sample's ``errors`` and the other reads go on. Appends ``{"kind":
    "k8s-observation", "started_at" (unix s), "path", ...}`` to the fault log so the evidence
    finds the file (``started_at``, not ``fault_at``: observing injects no fault, so the timeline
    gets no "fault injected" marker for it). Starting again while this run's sampler runs returns its state.

    Args:
        interval_s: seconds between samples (0.05 to 600); each sample makes 3 LIST calls plus one
            GET per node of the target pods (plus one HPA GET).
        max_duration_s: the sampler stops by itself after this many seconds (default 1 h).
        target_file: the target YAML (``service:`` for endpoints; ``hpa:`` or ``deployment:``
            for the HPA). configuration: Chaos Toolkit configuration (``infer_run_dir``).

    Returns:
        ``{"path", "interval_s", "max_duration_s", "started_at" (unix s), "ready" (ready
        endpoints, None without ``service:``), "pods", "nodes", "hpa", "errors": {source: line},
        "already_running"}``.

    Raises:
        ActivityFailed: bad interval/duration, allowlist refusal, the pods cannot be listed, or
            the target's ``hpa:`` is absent (404) or not readable (403).
    """
    try:
        interval = float(interval_s)
        max_s = float(max_duration_s)
    except (TypeError, ValueError):
        raise ActivityFailed(
            f"k8s_start_observation: interval_s and max_duration_s must be numbers, got "
            f"{interval_s!r}, {max_duration_s!r}"
        ) from None
    if not 0.05 <= interval <= 600:
        raise ActivityFailed(
            f"k8s_start_observation: interval_s must be 0.05..600, got {interval:g}"
        )
    if not 0 < max_s <= 7 * 86400:
        raise ActivityFailed(
            f"k8s_start_observation: max_duration_s must be > 0 and at most 7 days, got {max_s:g}"
        )
    path = settings.run_dir(configuration) / obs.OBSERVATIONS_FILE
    running = obs.running_sampler(path)
    if running is not None and running.alive:
        return {
            "path": str(path),
            "interval_s": running.interval_s,
            "max_duration_s": running.max_duration_s,
            "started_at": running.started_at,
            "samples": running.samples,
            "already_running": True,
        }
    ctx = k8s_context(target_file, configuration)
    t = ctx.target
    sampler = obs.Sampler(clients(t.kubeconfig, t.context), t, path, interval, max_s)
    try:
        first = sampler.start()
    except K8sError as exc:
        sampler.apis.api_client.close()
        raise ActivityFailed(str(exc)) from None
    log_fault(
        configuration,
        {
            "kind": "k8s-observation",
            "started_at": first["t"],
            "path": str(path),
            "namespace": t.namespace,
            "service": t.service,
            "hpa": sampler.hpa,
            "interval_s": interval,
        },
    )
    return {
        "path": str(path),
        "interval_s": interval,
        "max_duration_s": max_s,
        "started_at": first["t"],
        "ready": first["ready"],
        "pods": len(first["pods"] or {}),
        "nodes": sorted(first["nodes"]),
        "hpa": sampler.hpa,
        "errors": first["errors"],
        "already_running": False,
    }


def k8s_stop_observation(configuration: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rollback of :func:`k8s_start_observation`: stop this run's sampler and flush its file.

    The sampler takes one last sample (the state at the end of the drill) and writes its stop
    line. Idempotent and safe in any state (never raises): without a running sampler it reports
    so. Waits at most ~15 s (one sample's requests and timeouts) for the thread.

    Args:
        configuration: Chaos Toolkit configuration (``infer_run_dir``).

    Returns:
        ``{"path", "running_before" (bool), "samples", "errors": {source: failed reads},
        "reason", "stopped" (the thread has ended)}``.
    """
    path = settings.run_dir(configuration) / obs.OBSERVATIONS_FILE
    sampler = obs.running_sampler(path)
    if sampler is None:
        return {
            "path": str(path),
            "running_before": False,
            "samples": 0,
            "errors": {},
            "reason": "no observation running",
            "stopped": True,
        }
    return {"running_before": True, **sampler.stop("stopped")}


def _service_ctx(target_file: str | None, configuration: dict[str, Any] | None) -> Any:
    ctx = k8s_context(target_file, configuration)
    if not ctx.target.service:
        raise ActivityFailed(
            f"{ctx.target.source}: no 'service:' (the Service in front of the model pods, whose "
            "EndpointSlices give the ready endpoints); add it to the target file"
        )
    return ctx


def k8s_ready_endpoints(
    target_file: str | None = None, configuration: dict[str, Any] | None = None
) -> int:
    """Probe: how many endpoints of the target Service are ready (can receive traffic now).

    Read from the Service's EndpointSlices (``discovery.k8s.io/v1``), one per pod. Use it in a
    steady-state hypothesis, e.g. ``tolerance: {type: range, range: [3, 1000]}``.

    Args:
        target_file: the target YAML (needs ``service:``). configuration: Chaos Toolkit
            configuration.

    Returns:
        The number of ready endpoints.

    Raises:
        ActivityFailed: no ``service:`` in the target, allowlist refusal, or the LIST refused
            (403: RBAC ``endpointslices`` list).
    """
    from kubernetes import client

    ctx = _service_ctx(target_file, configuration)
    t = ctx.target
    try:
        eps = obs.list_endpoints(
            client.DiscoveryV1Api(ctx.core.api_client), t.namespace, str(t.service)
        )
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    return len(eps["ready"])


def _pod_states(
    target_file: str | None, configuration: dict[str, Any] | None
) -> dict[str, dict[str, Any]]:
    ctx = k8s_context(target_file, configuration)
    t = ctx.target
    try:
        pods = list_pods(ctx.core, t.namespace, t.selector)
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    return {p["metadata"]["name"]: obs.pod_state(p, t.container) for p in pods}


def k8s_restart_counts(
    target_file: str | None = None, configuration: dict[str, Any] | None = None
) -> dict[str, int]:
    """Probe: ``restartCount`` of the target container in each target pod.

    Args:
        target_file: the target YAML (``selector``, ``container``). configuration: Chaos Toolkit
            configuration.

    Returns:
        ``{pod name: restartCount}`` (0 for a pod whose container has not started yet).

    Raises:
        ActivityFailed: allowlist refusal or the pod LIST refused (403).
    """
    return {
        name: int(st["restarts"]) for name, st in _pod_states(target_file, configuration).items()
    }


def k8s_oomkilled_pods(
    target_file: str | None = None, configuration: dict[str, Any] | None = None
) -> list[str]:
    """Probe: target pods whose target container was OOM-killed (last termination, or now).

    A pod counts when its container's ``lastState.terminated.reason`` or current
    ``state.terminated.reason`` is ``OOMKilled`` (what the kubelet reports after the kernel's
    OOM killer ended it).

    Args:
        target_file: the target YAML. configuration: Chaos Toolkit configuration.

    Returns:
        The pod names, sorted (``[]`` when none).

    Raises:
        ActivityFailed: allowlist refusal or the pod LIST refused (403).
    """
    return sorted(
        name
        for name, st in _pod_states(target_file, configuration).items()
        if "OOMKilled" in (st["last_reason"], st["reason"])
    )


def _spike_start(configuration: dict[str, Any] | None, now: float) -> tuple[float, str]:
    """When the spike started (unix s) and how that is known.

    1. the ``traffic-spike`` fault in this run's fault log (``fault_at``, written by the lab's
       ``inject_traffic_spike``);
    2. the load control's rate profile: the configuration's ``load_profile`` (the control's
       ``profile``), ``load_seed`` and ``spike_phase`` (default 1): the schedule start is rebuilt
       from the first records' ``intended_at`` (as the lab drill does), plus the phases before the
       spike. The control itself writes no phase marker while it runs (its phases reach
       ``load.log`` only when the load ends);
    3. else the call time.
    """
    from chaoslib_infer.evidence.figures import read_jsonl

    for f in reversed(read_jsonl(settings.faults_path(configuration))):
        if f.get("kind") == "traffic-spike" and isinstance(f.get("fault_at"), int | float):
            return float(f["fault_at"]), "traffic-spike fault (faults.jsonl)"
    cfg = configuration or {}
    profile = cfg.get("load_profile")
    if isinstance(profile, list) and profile:
        from chaoslib_infer.drills.traffic_spike.actions import load_started_at
        from chaoslib_infer.lab.activity import run_records
        from chaoslib_infer.load.schedule import check_profile

        try:
            phases = check_profile(profile)
            k = int(cfg.get("spike_phase") or 1)
        except (TypeError, ValueError):
            phases, k = [], 0
        if 1 <= k < len(phases):
            seed = cfg.get("load_seed")
            if isinstance(seed, str) and seed.startswith("${"):
                seed = None
            started = load_started_at(run_records(configuration), phases, seed)
            if started is not None:
                return started + sum(d for d, _ in phases[:k]), "load profile (records.jsonl)"
    return now, "call time"


def k8s_wait_scale_out(
    min_new_ready: int = 1,
    timeout_s: float = 300.0,
    poll_s: float = 1.0,
    target_file: str | None = None,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """traffic-spike: wait for the scale-out; time the HPA decision, new pods, Ready and serving.

    Records the baseline (ready endpoints, pods, HPA desired/current replicas: the target's
    ``hpa:``, else the HPA, e.g. KEDA's ``keda-hpa-<name>``, whose ``scaleTargetRef`` is the
    target's Deployment; none is fine), then polls every ``poll_s`` until ``min_new_ready`` new
    pods have a ready endpoint. Times are relative to the spike start: the ``traffic-spike``
    fault of this run, else the load control's rate profile (configuration ``load_profile``,
    ``load_seed``, ``spike_phase``), else the call time (``spike_source`` says which). The result
    is appended to the fault log as ``kind: k8s-scale-out`` (also on a timeout).

    Args:
        min_new_ready: new ready endpoints to wait for (>= 1).
        timeout_s: bound on the wait, seconds.
        poll_s: polling interval, seconds (the figures' precision).
        target_file: the target YAML (needs ``service:``). configuration: Chaos Toolkit
            configuration.

    Returns:
        See :func:`chaoslib_infer.platforms.kubernetes.observe.wait_scale_out`, plus
        ``spike_source``. Figures: ``hpa_desired_at_s``, ``pod_created_at_s``, ``ready_at_s``,
        ``serving_at_s``, ``completed_at_s`` (seconds after the spike start).

    Raises:
        ActivityFailed: bad arguments, no ``service:``, allowlist refusal, an API call refused, or
            no scale-out within ``timeout_s`` (one line with what was seen).
    """
    try:
        need, limit, poll = int(min_new_ready), float(timeout_s), float(poll_s)
    except (TypeError, ValueError):
        raise ActivityFailed(
            "k8s_wait_scale_out: min_new_ready, timeout_s and poll_s must be numbers"
        ) from None
    if need < 1 or not 0 < limit <= 86400 or not 0.01 <= poll <= 60:
        raise ActivityFailed(
            f"k8s_wait_scale_out: need min_new_ready >= 1, 0 < timeout_s <= 86400, "
            f"0.01 <= poll_s <= 60; got {need}, {limit:g}, {poll:g}"
        )
    ctx = _service_ctx(target_file, configuration)
    spike_at, source = _spike_start(configuration, time.time())
    try:
        out = obs.wait_scale_out(ctx.core.api_client, ctx.target, spike_at, need, limit, poll)
    except K8sError as exc:
        raise ActivityFailed(str(exc)) from None
    out["spike_source"] = source
    log_fault(configuration, {**out, "fault_at": spike_at})
    if out["timed_out"]:
        hpa = (
            f"HPA {out['hpa']} desired {out['hpa_desired_before']} -> {out['hpa_desired_after']}, "
            f"current {out['hpa_current_after']}"
            if out["hpa"]
            else f"HPA not read ({out['hpa_error']})"
            if out["hpa_error"]
            else "no HPA found"
        )
        pods = ", ".join(
            f"{p['pod']} {p['phase'] or '?'}{' Ready' if p['ready_at'] else ''}"
            f" on {p['node'] or '-'}"
            for p in out["new_pods"][:5]
        )
        raise ActivityFailed(
            f"no scale-out within {limit:g} s: {out['new_ready']} of {need} new ready endpoint(s); "
            f"ready endpoints {out['ready_before']} -> {out['ready_after']}; {hpa}; "
            f"new pods: {pods or 'none'}"
        )
    return out
