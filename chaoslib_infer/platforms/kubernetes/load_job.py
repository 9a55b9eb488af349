"""Distributed load on Kubernetes: the workers of :mod:`chaoslib_infer.load.workers` as an Indexed
Job (``completionMode: Indexed``, ``completions`` = ``parallelism`` = N, ``backoffLimit`` 0,
``activeDeadlineSeconds``) in the runner's namespace: :func:`run_k8s` creates it, waits for it,
reads every pod's log, merges, and deletes the Job (also on failure and Ctrl-C). The records stay
in the worker pods (lost with them); the histograms and counts are the result.

Here, not in :mod:`chaoslib_infer.load`, so the load package does not import the Kubernetes
plumbing (the load is below the platforms: issue 22).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from chaoslib_infer.load.workers import (
    job_manifest,
    merge_results,
    parse_result,
    stage_timeout,
    stages,
)
from chaoslib_infer.platforms.kubernetes import call, call_bytes, clients

__all__ = ["run_k8s"]


def run_k8s(
    target: Any,
    mode: str,
    params: Mapping[str, Any],
    n: int,
    out_dir: Path,
    image: str,
    namespace: str = "chaos-infer",
    log: Callable[[str], None] = lambda _m: None,
    poll_s: float = 2.0,
    start_delay_s: float = 30.0,
) -> dict[str, Any]:
    """Run the workers as a Kubernetes Indexed Job in ``namespace``; merge their pod logs.

    The cluster is the target file's (kubeconfig, context); its allowlist was checked by the
    caller (:func:`~chaoslib_infer.platforms.kubernetes.target.load_target`). The Job is
    deleted (``propagationPolicy: Background``) when done, failed or interrupted.

    Args:
        target: the ``K8sTarget``.
        mode, params, n: as :func:`chaoslib_infer.load.workers.run_local`.
        out_dir: where ``report.json`` and each worker's log (``worker-K.log``) go.
        image: the container image with this package (see the project's ``Dockerfile``).
        namespace: where the Job runs (RBAC: ``deploy/rbac.yaml``, Role chaos-infer-load-workers).
        log: progress line sink. poll_s: Job status polling interval, seconds.
        start_delay_s: the common start is this many seconds after the Job is created (image
            pull and pod start-up; a later pod starts at once and overlaps less).

    Returns:
        The merged report (:func:`merge_results`).

    Raises:
        K8sError: an API call refused (one line: 403 names the missing permission).
        RuntimeError: a worker failed, the Job overran its deadline, or a log has no result.
    """
    from kubernetes import client

    api = clients(target.kubeconfig, target.context)
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for i, (stage_params, workers) in enumerate(stages(mode, params, n)):
        name = f"chaos-infer-load-{int(time.time())}-{i}"
        stage = {**stage_params, "start_at": round(time.time() + start_delay_s, 3)}
        deadline = int(stage_timeout(mode, stage) + start_delay_s)
        job = job_manifest(name, namespace, image, mode, stage, workers, deadline)
        call(f"create job {namespace}/{name}", batch.create_namespaced_job, namespace, job)
        log(f"workers: Job {namespace}/{name} created ({workers} indexed pod(s))")
        try:
            stage_results = _wait_job(batch, core, namespace, name, workers, deadline, poll_s)
        finally:
            call_bytes(
                f"delete job {namespace}/{name}",
                batch.delete_namespaced_job,
                name,
                namespace,
                propagation_policy="Background",
            )
        for k, (res, text) in enumerate(stage_results):
            (out_dir / f"worker-{i}-{k}.log").write_text(text, encoding="utf-8")
            results.append(res)
    report = merge_results(mode, results, n)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    return report


def _wait_job(
    batch: Any, core: Any, namespace: str, name: str, n: int, deadline_s: float, poll_s: float
) -> list[tuple[dict[str, Any], str]]:
    end = time.monotonic() + deadline_s + 30.0
    while True:
        job = call(f"get job {namespace}/{name}", batch.read_namespaced_job, name, namespace)
        status = (job or {}).get("status") or {}
        if int(status.get("succeeded") or 0) >= n:
            break
        if int(status.get("failed") or 0) > 0:
            raise RuntimeError(f"Job {namespace}/{name}: {status['failed']} worker pod(s) failed")
        if time.monotonic() > end:
            raise RuntimeError(f"Job {namespace}/{name} did not complete in {deadline_s:.0f} s")
        time.sleep(poll_s)
    pods = call(
        f"list pods of job {namespace}/{name}",
        core.list_namespaced_pod,
        namespace,
        label_selector=f"batch.kubernetes.io/job-name={name}",
    )
    by_index: dict[int, tuple[dict[str, Any], str]] = {}
    for pod in (pods or {}).get("items") or []:
        meta = pod["metadata"]
        if (pod.get("status") or {}).get("phase") != "Succeeded":
            continue
        idx = int((meta.get("annotations") or {})["batch.kubernetes.io/job-completion-index"])
        text = call_bytes(
            f"read log of pod {namespace}/{meta['name']}",
            core.read_namespaced_pod_log,
            meta["name"],
            namespace,
            container="worker",
        ).decode("utf-8", errors="replace")
        res = parse_result(text)
        if res is None:
            raise RuntimeError(f"pod {namespace}/{meta['name']}: no result line in its log")
        by_index[idx] = (res, text)
    missing = sorted(set(range(n)) - set(by_index))
    if missing:
        raise RuntimeError(f"Job {namespace}/{name}: no result from index(es) {missing}")
    return [by_index[k] for k in range(n)]
