"""Locust's own distribution as the drills' load: the master here, its workers elsewhere.

The load block's ``distributed`` option (arguments of ``chaoslib_infer.locust.control``)::

    load: {engine: locust, locustfile: lf.py, users: 64, spawn_rate: 16,
           distributed: {expect_workers: 4, master_bind_host: "*", master_bind_port: 5557,
                         master_host: 10.0.0.5, connect_timeout_s: 120,
                         kubernetes: {workers: 4, image: registry/chaoslib-infer:0.1.0,
                                      namespace: chaos-infer, target: target.yaml}}}

The control starts the **master** headless on this machine (``locust -f FILE --master --headless
--expect-workers N --master-bind-host H --master-bind-port P ...``, with
``--chaos-records-via-master``) and waits for its workers: a clear error naming the worker command
when fewer than ``expect_workers`` connect within ``connect_timeout_s``. The **workers** are
Locust's own: the operator starts them on other machines with ``locust -f FILE --worker
--master-host MASTER_HOST --master-port P`` (``worker_command`` in ``locust.json``), or the control
creates them as a **Kubernetes Indexed Job** (``kubernetes:``; the Job of
``chaoslib_infer.load.workers.job_manifest``, its container running ``locust -f - --worker
--master-host MASTER_HOST --master-port P``: ``-f -`` fetches the locustfile's text from the
master, so only the image needs the package), deleted with the drill (also when the drill fails or
is interrupted; its ``activeDeadlineSeconds`` ends it if the runner itself dies).

The workers' records travel to the master with Locust's own stats reports
(:mod:`chaoslib_infer.locust.relay`); the master writes them into the run's ``records.jsonl``
and keeps a per-worker ledger (``locust_workers.json``), which the control copies into
``locust.json``: ``workers`` (records each delivered) and ``workers_lost``.

This module never imports Locust.
"""

from __future__ import annotations

import atexit
import json
import logging
import shlex
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoslib.exceptions import InterruptExecution

__all__ = [
    "DEFAULT_NAMESPACE",
    "WORKERS_FILE",
    "Distributed",
    "KubernetesWorkers",
    "parse_distributed",
    "read_ledger",
    "summarize",
]

log = logging.getLogger("chaostoolkit")

#: The master's ledger of its workers, in the run folder (``chaoslib_infer.locust.relay``).
WORKERS_FILE = "locust_workers.json"
#: Where the workers' Job runs by default (``deploy/rbac.yaml``, Role chaos-infer-load-workers).
DEFAULT_NAMESPACE = "chaos-infer"
_KEYS = {
    "expect_workers", "master_bind_host", "master_bind_port", "master_host",
    "connect_timeout_s", "kubernetes",
}  # fmt: skip
_K8S_KEYS = {"workers", "image", "namespace", "target", "locustfile"}


def _bad(msg: str) -> InterruptExecution:
    return InterruptExecution(f"locust load: distributed: {msg}")


def _int(name: str, v: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise _bad(f"{name} must be an integer {rng}, got {v!r}")
    return v


def _text(name: str, v: Any) -> str:
    if not isinstance(v, str) or not v.strip() or any(c.isspace() for c in v.strip()):
        raise _bad(f"{name} must be a non-empty string without spaces, got {v!r}")
    return v.strip()


def read_ledger(path: Path) -> dict[str, Any] | None:
    """The master's ledger (``locust_workers.json``), or None while it is absent or unreadable."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


@dataclass
class KubernetesWorkers:
    """The workers as an Indexed Job (``kubernetes:`` of the distributed option)."""

    workers: int
    image: str
    namespace: str = DEFAULT_NAMESPACE
    target: str | None = None  # the target file (cluster, context, allowlist)
    locustfile: str = "-"  # "-": fetched from the master; else a path inside the image
    job: str | None = None
    created_at: float | None = None
    deleted: bool = False
    status: dict[str, Any] = field(default_factory=dict)


@dataclass
class Distributed:
    """The distributed option, validated; the state of one run (its Job)."""

    expect_workers: int
    master_bind_host: str = "*"
    master_bind_port: int = 5557
    master_host: str | None = None
    connect_timeout_s: float = 60.0
    kubernetes: KubernetesWorkers | None = None
    ledger_path: Path | None = None
    reported_lost: set[str] = field(default_factory=set)
    api: Any = None  # BatchV1Api of the Job's cluster

    # -- the master ----------------------------------------------------------------------------
    def master_args(self, ledger_path: Path) -> list[str]:
        """Locust's master options (after ``-f FILE --headless ...``)."""
        self.ledger_path = ledger_path
        ledger_path.unlink(missing_ok=True)
        return [
            "--master", "--expect-workers", str(self.expect_workers),
            "--expect-workers-max-wait", str(int(self.connect_timeout_s) + 15),
            "--master-bind-host", self.master_bind_host,
            "--master-bind-port", str(self.master_bind_port),
            "--chaos-records-via-master", "--chaos-workers-file", str(ledger_path),
        ]  # fmt: skip

    def worker_command(self, locustfile: str) -> str:
        """The command that starts one worker on another machine (documented, in locust.json)."""
        host = self.master_host or "MASTER_HOST"
        return shlex.join(
            ["locust", "-f", locustfile, "--worker", "--master-host", host,
             "--master-port", str(self.master_bind_port)]
        )  # fmt: skip

    def describe(self, locustfile: str) -> dict[str, Any]:
        """What ``locust.json`` says about the distribution."""
        out: dict[str, Any] = {
            "expect_workers": self.expect_workers,
            "master_bind_host": self.master_bind_host,
            "master_bind_port": self.master_bind_port,
            "master_host": self.master_host,
            "connect_timeout_s": self.connect_timeout_s,
            "worker_command": self.worker_command(locustfile),
            "records_transport": "Locust stats reports (events.report_to_master / "
            "worker_report, about every 3 s, and a last one at each worker's stop); the master "
            "appends them to records.jsonl",
        }
        k = self.kubernetes
        if k is not None:
            out["kubernetes"] = {
                "job": k.job, "namespace": k.namespace, "image": k.image, "workers": k.workers,
                "created_at": k.created_at, "deleted": k.deleted, "status": k.status,
            }  # fmt: skip
        return out

    def ledger(self) -> dict[str, Any] | None:
        return read_ledger(self.ledger_path) if self.ledger_path is not None else None

    def wait_for_workers(self, proc: subprocess.Popen[bytes], run_dir: Path, lf: str) -> None:
        """Wait until ``expect_workers`` workers have connected to the master.

        Raises:
            InterruptExecution: the master exited, the Job's pods failed, or fewer connected
                within ``connect_timeout_s`` (one line naming the worker command).
        """
        deadline = time.monotonic() + self.connect_timeout_s
        next_job_check = time.monotonic() + 2.0
        while True:
            doc = self.ledger() or {}
            n = int(doc.get("connected") or 0)
            if n >= self.expect_workers:
                log.info("locust load: %d Locust worker(s) connected to the master", n)
                return
            if proc.poll() is not None:
                raise _bad(
                    f"the Locust master exited with code {proc.returncode} before its workers "
                    f"connected; see {run_dir / 'locust.log'}"
                )
            k = self.kubernetes
            if k is not None and k.job and time.monotonic() >= next_job_check:
                next_job_check = time.monotonic() + 2.0
                failed = int(self.job_status().get("failed") or 0)
                if failed:
                    raise _bad(
                        f"{failed} pod(s) of Job {k.namespace}/{k.job} failed before connecting "
                        f"(kubectl -n {k.namespace} logs job/{k.job})"
                    )
            if time.monotonic() >= deadline:
                how = (
                    f"the Job {k.namespace}/{k.job}'s pods must reach {self.master_host}:"
                    f"{self.master_bind_port} (kubectl -n {k.namespace} describe job {k.job})"
                    if k is not None
                    else f"start each worker with: {self.worker_command(lf)}"
                )
                raise _bad(
                    f"{n} of {self.expect_workers} Locust worker(s) connected to the master (port "
                    f"{self.master_bind_port}) within {self.connect_timeout_s:g} s; {how}"
                )
            time.sleep(0.2)

    def poll_lost(self) -> list[dict[str, Any]]:
        """Workers newly found lost in the master's ledger (each reported once)."""
        doc = self.ledger() or {}
        new = []
        for w in doc.get("workers_lost") or []:
            key = str(w.get("worker"))
            if key not in self.reported_lost:
                self.reported_lost.add(key)
                new.append(w)
        return new

    # -- the Kubernetes Job --------------------------------------------------------------------
    def start_job(
        self, configuration: Mapping[str, Any] | None, max_s: float, stop_s: float
    ) -> None:
        """Create the workers' Indexed Job (no-op without ``kubernetes:``).

        Raises:
            InterruptExecution: no target file, one outside the allowlist, or the API refused.
        """
        k = self.kubernetes
        if k is None:
            return
        from kubernetes import client

        from chaoslib_infer.errors import InferChaosError
        from chaoslib_infer.load.workers import job_manifest
        from chaoslib_infer.platforms.kubernetes import call, clients
        from chaoslib_infer.platforms.kubernetes.target import load_target

        path = k.target or (configuration or {}).get("infer_k8s_target")
        if not path:
            raise _bad("kubernetes: give 'target' (a target file) or set infer_k8s_target")
        try:
            target = load_target(str(path), check=True, configuration=dict(configuration or {}))
            self.api = client.BatchV1Api(clients(target.kubeconfig, target.context))
            name = f"chaos-infer-locust-{int(time.time())}"
            deadline = int(self.connect_timeout_s + max_s + stop_s + 120)
            job = job_manifest(name, k.namespace, k.image, "locust", {}, k.workers, deadline)
            job["metadata"]["labels"]["app.kubernetes.io/component"] = "locust-worker"
            tmpl = job["spec"]["template"]
            tmpl["metadata"]["labels"]["app.kubernetes.io/component"] = "locust-worker"
            (c,) = tmpl["spec"]["containers"]
            c["name"] = "locust-worker"
            c["command"] = ["locust"]
            c["args"] = [
                "-f", k.locustfile, "--worker", "--master-host", str(self.master_host),
                "--master-port", str(self.master_bind_port),
            ]  # fmt: skip
            # -f - writes the master's locustfile to the temporary folder: the emptyDir
            c["env"] = [{"name": "TMPDIR", "value": "/work/out"}]
            k.job = name  # before the call: a Ctrl-C during it still deletes the Job
            atexit.register(self.delete_job)  # and so does a runner that exits without a stop
            call(f"create job {k.namespace}/{name}", self.api.create_namespaced_job,
                 k.namespace, job)  # fmt: skip
        except InferChaosError as exc:
            raise _bad(f"kubernetes: {exc}") from exc
        k.created_at = time.time()
        log.info("locust load: Job %s/%s created (%d Locust worker pod(s))", k.namespace, name,
                 k.workers)  # fmt: skip

    def job_status(self) -> dict[str, Any]:
        """The Job's ``status`` counts (active, succeeded, failed); {} when unknown."""
        k = self.kubernetes
        if k is None or not k.job or self.api is None or k.deleted:
            return dict(k.status) if k is not None else {}
        from chaoslib_infer.errors import InferChaosError
        from chaoslib_infer.platforms.kubernetes import call

        try:
            job = call(f"get job {k.namespace}/{k.job}", self.api.read_namespaced_job, k.job,
                       k.namespace)  # fmt: skip
        except InferChaosError as exc:
            log.warning("locust load: %s", exc)
            return dict(k.status)
        st = (job or {}).get("status") or {}
        k.status = {key: int(st.get(key) or 0) for key in ("active", "succeeded", "failed")}
        return dict(k.status)

    def delete_job(self) -> None:
        """Delete the workers' Job (idempotent; a Job already gone is fine)."""
        k = self.kubernetes
        if k is None or not k.job or k.deleted or self.api is None:
            return
        from chaoslib_infer.errors import InferChaosError
        from chaoslib_infer.platforms.kubernetes import call_bytes

        self.job_status()
        try:
            call_bytes(f"delete job {k.namespace}/{k.job}", self.api.delete_namespaced_job,
                       k.job, k.namespace, propagation_policy="Background")  # fmt: skip
        except InferChaosError as exc:
            if getattr(exc, "status", None) != 404:
                log.warning("locust load: %s (delete it by hand)", exc)
                return
        k.deleted = True
        atexit.unregister(self.delete_job)
        log.info("locust load: Job %s/%s deleted", k.namespace, k.job)


def parse_distributed(spec: Any, processes: int) -> Distributed | None:
    """Validate the ``distributed`` option (None: not distributed).

    Raises:
        InterruptExecution: not a mapping, an unknown key, a bad value, ``processes`` > 1 with it,
            or ``kubernetes`` without ``master_host`` (one line).
    """
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise _bad(f"must be a mapping (expect_workers, master_bind_port, ...), got {spec!r}")
    unknown = sorted(set(spec) - _KEYS)
    if unknown:
        raise _bad(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_KEYS))}")
    if processes > 1:
        raise _bad(
            "'processes' forks workers on this machine; with 'distributed' the workers are "
            "Locust's --worker processes (give --processes N on their command line instead)"
        )
    k8s = None
    if spec.get("kubernetes") is not None:
        kd = spec["kubernetes"]
        if not isinstance(kd, Mapping):
            raise _bad(f"kubernetes must be a mapping (workers, image, ...), got {kd!r}")
        unknown = sorted(set(kd) - _K8S_KEYS)
        if unknown:
            raise _bad(
                f"kubernetes: unknown key(s) {', '.join(unknown)}; known: "
                f"{', '.join(sorted(_K8S_KEYS))}"
            )
        from chaoslib_infer import __version__

        k8s = KubernetesWorkers(
            workers=_int("kubernetes.workers", kd.get("workers"), 1, 1000),
            image=_text("kubernetes.image", kd.get("image", f"chaoslib-infer:{__version__}")),
            namespace=_text("kubernetes.namespace", kd.get("namespace", DEFAULT_NAMESPACE)),
            target=None if kd.get("target") is None else str(kd["target"]),
            locustfile=_text("kubernetes.locustfile", kd.get("locustfile", "-")),
        )
    expect = spec.get("expect_workers", k8s.workers if k8s is not None else None)
    if expect is None:
        raise _bad("give expect_workers (how many Locust workers the master waits for)")
    expect = _int("expect_workers", expect, 1, 10000)
    if k8s is not None and expect < k8s.workers:
        raise _bad(f"expect_workers ({expect}) is less than kubernetes.workers ({k8s.workers})")
    host = spec.get("master_host")
    if host is not None:
        host = _text("master_host", host)
    if k8s is not None and host is None:
        raise _bad(
            "kubernetes: give master_host, the address of this machine that the Job's pods "
            "connect to"
        )
    timeout = spec.get("connect_timeout_s", 60.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise _bad(f"connect_timeout_s must be a number > 0, got {timeout!r}")
    return Distributed(
        expect_workers=expect,
        master_bind_host=_text("master_bind_host", spec.get("master_bind_host", "*")),
        master_bind_port=_int("master_bind_port", spec.get("master_bind_port", 5557), 1, 65535),
        master_host=host,
        connect_timeout_s=float(timeout),
        kubernetes=k8s,
    )


def summarize(doc: Mapping[str, Any] | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(workers, workers_lost)`` for ``locust.json`` from the master's ledger."""
    if not doc:
        return [], []
    workers = [
        {
            "worker": w.get("client_id"),
            "index": w.get("index"),
            "host": w.get("host"),
            "pid": w.get("pid"),
            "records_delivered": w.get("records", 0),
            "records_made": w.get("records_made", 0),
            "records_missing": w.get("records_missing", 0),
            "records_rejected": w.get("records_rejected", 0),
            "reports": w.get("reports", 0),
            "last_report_at": w.get("last_report_at"),
            "last_report_delivered": bool(w.get("final")),
            "ended": w.get("ended"),
            "run_ids": w.get("run_ids") or [],
            "report_delay_min_s": w.get("report_delay_min_s"),
        }
        for w in doc.get("workers") or []
    ]
    return workers, list(doc.get("workers_lost") or [])
