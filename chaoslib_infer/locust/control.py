"""Chaos Toolkit control: Locust as the drills' load (``load: {engine: locust, ...}``).

Declare it in an experiment instead of the built-in generator::

    controls:
      - name: background-load
        provider:
          type: python
          module: chaoslib_infer.locust.control
          arguments: {locustfile: examples/locust/chat.py, users: 8, spawn_rate: 8,
                      processes: 2, warmup_s: 6, max_duration_s: 240}

(or keep ``module: chaoslib_infer.controls.load`` and add ``engine: locust`` to its arguments).
Before the experiment it starts Locust headless as a separate process group (``python -m locust
-f LOCUSTFILE --headless -u USERS -r SPAWN_RATE -t MAX_DURATION --host TARGET``, with
``--processes N`` when ``processes`` > 1: one master and N forked workers, Locust's own way to use
more cores), pointed at the drill's target (``infer_base_url`` or the lab, allowlist checked).
The locustfile's users must record (``chaoslib_infer.locust.user``): they append every attempt to
the drill's ``records.jsonl`` (``--chaos-records``), which the probes, figures and evidence read
as they read the built-in client's. Locust's own CSV goes to ``<run_dir>/locust_*.csv`` and its
log to ``<run_dir>/locust.log``. The control waits ``warmup_s`` and interrupts the experiment if
no attempt succeeded. After the experiment (after the rollbacks) it stops Locust (SIGTERM, then
SIGKILL after ``grace_s``); Locust also stops by itself after ``max_duration_s``.

Lost workers are reported, never silently lost: a watcher thread checks every worker process
every 0.5 s; one that dies before the stop is listed in ``<run_dir>/locust.json`` under
``workers_lost`` (pid, when it was found dead), with Locust's own "missing worker" log lines,
logged as a warning, and returned by ``stop_locust``. Its attempts in flight at its death have no
record.

Beyond one machine, ``distributed`` (:mod:`chaoslib_infer.locust.distributed`): the control
starts Locust's master headless here (``--master --expect-workers N``) and waits for its workers,
Locust's own ``--worker`` processes, started by the operator on other machines or created as a
Kubernetes Indexed Job (``distributed.kubernetes``) that is deleted with the drill. The workers'
records travel to the master with Locust's stats reports (:mod:`chaoslib_infer.locust.relay`),
and the master writes them into ``records.jsonl``; ``locust.json`` then lists every worker with
the records it delivered (``workers``) and those lost (``workers_lost``: no heartbeat, or quit
during the drill; the attempts a killed worker made after its last report, at most ~3 s, are
lost). See ``docs/locust.md``.

Honest limit, written into ``locust.json`` (``note``) and logged: Locust users are closed loop;
they are not an open-loop schedule. A user waits for each reply before its next request, so when
the service slows down fewer requests are offered and latency is under-reported (coordinated
omission, ``docs/definitions.md``, "Send time"); ``intended_at`` equals ``sent_at`` and the
schedule lag says nothing. Compare SLOs with the built-in open-loop client's.

This module never imports Locust (it would monkey-patch the runner with gevent).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from chaoslib.exceptions import InterruptExecution

from chaoslib_infer import settings
from chaoslib_infer.errors import InferChaosError
from chaoslib_infer.locust.distributed import (
    WORKERS_FILE,
    Distributed,
    parse_distributed,
    summarize,
)

__all__ = [
    "CO_NOTE",
    "LOCUST_FILE",
    "after_experiment_control",
    "before_experiment_control",
    "start_locust",
    "stop_locust",
]

log = logging.getLogger("chaostoolkit")

#: The coordinated-omission warning every Locust-driven run carries.
CO_NOTE = (
    "Locust users are closed loop, not an open-loop schedule: each user waits for its reply "
    "before the next request, so a slow service is offered less load and its latency is "
    "under-reported (coordinated omission); intended_at equals sent_at, the schedule lag is not "
    "measured"
)
#: In the run folder: what ran, its workers, those lost, the note.
LOCUST_FILE = "locust.json"
_MISSING = re.compile(
    r"(failed to send heartbeat|missing|exited with code|Bad response code)", re.I
)


class _Run:
    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        run_dir: Path,
        info: dict[str, Any],
        dist: Distributed | None = None,
    ):
        self.proc = proc
        self.run_dir = run_dir
        self.info = info
        self.dist = dist
        self.workers: list[int] = []
        self.lost: dict[int, float] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="locust-workers", daemon=True)

    def _watch(self) -> None:
        while not self.stopping.wait(0.5):
            if self.proc.poll() is not None:
                return
            if self.dist is not None:  # the master's ledger says which workers were lost
                for w in self.dist.poll_lost():
                    log.warning(
                        "Locust worker %s (%s, index %s) lost during the drill (%s): %s record(s) "
                        "delivered up to its last report (see %s)",
                        w.get("worker"), w.get("host"), w.get("index"), w.get("reason"),
                        w.get("records_delivered"), self.run_dir / LOCUST_FILE,
                    )  # fmt: skip
                    self.write()
                continue
            if not self.workers:
                self.workers = _children(self.proc.pid)
                continue
            for pid in self.workers:
                if pid not in self.lost and not _alive(pid):
                    self.lost[pid] = time.time()
                    log.warning(
                        "Locust worker %d died during the drill: its attempts in flight have no "
                        "record (see %s)",
                        pid,
                        self.run_dir / LOCUST_FILE,
                    )
                    self.write()

    def write(self, **extra: Any) -> None:
        if self.dist is not None:
            workers, lost = summarize(self.dist.ledger())
            self.info.update(
                distributed=self.dist.describe(str(self.info["locustfile"])),
                workers=workers,
                workers_lost=lost,
                records_delivered={str(w["worker"]): w["records_delivered"] for w in workers},
                **extra,
            )
        else:
            self.info.update(
                worker_pids=list(self.workers),
                workers_lost=[{"pid": p, "found_dead_at": t} for p, t in sorted(self.lost.items())],
                **extra,
            )
        with contextlib.suppress(OSError):
            (self.run_dir / LOCUST_FILE).write_text(json.dumps(self.info, indent=1))


_RUNNING: dict[str, _Run] = {}


def _children(pid: int) -> list[int]:
    """Pids of the live child processes of ``pid`` (from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and fields[1] == str(pid) and fields[0] != "Z":
            out.append(int(d.name))
    return sorted(out)


def _alive(pid: int) -> bool:
    """True when ``pid`` runs and is not a zombie (a dead forked worker stays a zombie until its
    master reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def _count_ok(path: Path) -> int:
    if not path.exists():
        return 0
    with path.open("rb") as fh:
        return sum(1 for line in fh if b'"ok":true' in line or b'"ok": true' in line)


def _positive_int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InterruptExecution(f"locust load: {name} must be an integer >= 1, got {v!r}")
    return v


def _positive(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
        raise InterruptExecution(f"locust load: {name} must be a number > 0, got {v!r}")
    return float(v)


def start_locust(
    locustfile: str,
    users: int = 8,
    spawn_rate: float | None = None,
    processes: int = 1,
    warmup_s: float = 6.0,
    max_duration_s: float = 300.0,
    stop_timeout_s: float = 10.0,
    extra_args: list[str] | None = None,
    startup_timeout_s: float = 20.0,
    configuration: dict[str, Any] | None = None,
    distributed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Start Locust headless against the drill's target and wait for its warm-up.

    Args:
        locustfile: path of a locustfile whose users record (``chaoslib_infer.locust.user``);
            relative to the working directory.
        users: Locust users (``-u``). spawn_rate: users started per second (``-r``; default
            ``users``, all at once). processes: Locust processes (> 1: ``--processes N``, one
            master and N workers).
        warmup_s: seconds before the first steady-state hypothesis; at least one attempt must
            have succeeded by then.
        max_duration_s: Locust's own run-time limit (``-t``), seconds.
        stop_timeout_s: Locust's ``--stop-timeout``: how long users may finish their request at
            the stop.
        extra_args: more Locust arguments (e.g. ``["--tags", "chat"]``).
        startup_timeout_s: Locust takes seconds to start (imports, forked workers): when no
            attempt has succeeded after ``warmup_s``, wait for the first success up to this long
            from the start before giving up.
        configuration: Chaos Toolkit configuration (target URL, run directory).
        distributed: Locust's master here and its workers elsewhere
            (:func:`~chaoslib_infer.locust.distributed.parse_distributed`: ``expect_workers``,
            ``master_bind_host``, ``master_bind_port``, ``master_host``, ``connect_timeout_s``,
            ``kubernetes``); the warm-up starts once the workers have connected.

    Returns:
        ``{"engine": "locust", "pid", "records", "url", "users", "spawn_rate", "processes",
        "note"}`` (``note``: ``CO_NOTE``).

    Raises:
        InterruptExecution: bad arguments, no locust installed, no target or one outside the
            allowlist, Locust exited early, or no attempt succeeded in warm-up (one line).
    """
    import importlib.util

    lf = Path(str(locustfile)).expanduser()
    if not lf.is_file():
        raise InterruptExecution(f"locust load: locustfile {lf} not found")
    users = _positive_int("users", users)
    processes = _positive_int("processes", processes)
    rate = _positive("spawn_rate", spawn_rate if spawn_rate is not None else users)
    warm = _positive("warmup_s", warmup_s)
    max_s = max(1, int(_positive("max_duration_s", max_duration_s)))
    stop_s = max(0, int(_positive("stop_timeout_s", stop_timeout_s)))
    dist = parse_distributed(distributed, processes)
    if importlib.util.find_spec("locust") is None:
        raise InterruptExecution("locust load: locust is not installed (pip install '.[locust]')")

    url = settings.target_url(configuration)
    try:
        from chaoslib_infer.safety.allowlist import check_target

        check_target(url, configuration=configuration)  # + the game day's infer_allow
    except InferChaosError as exc:
        raise InterruptExecution(str(exc)) from exc
    run_dir = settings.run_dir(configuration)
    records = settings.records_path(configuration)
    cmd = [
        sys.executable, "-m", "locust", "-f", str(lf.resolve()), "--headless",
        "-u", str(users), "-r", f"{rate:g}", "-t", f"{max_s}s", "--host", url,
        "--csv", str(run_dir / "locust"), "--chaos-records", str(records),
        "--stop-timeout", str(stop_s), "--only-summary", "--logfile", str(run_dir / "locust.log"),
        "--exit-code-on-error", "0",
    ]  # fmt: skip
    if processes > 1:
        cmd += ["--processes", str(processes)]
    if dist is not None:
        cmd += dist.master_args(run_dir / WORKERS_FILE)
    cmd += [str(a) for a in (extra_args or [])]
    env = {**os.environ, "CHAOS_INFER_RECORDS": str(records)}
    with (run_dir / "locust.out").open("ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    info: dict[str, Any] = {
        "engine": "locust", "locustfile": str(lf), "users": users, "spawn_rate": rate,
        "processes": processes, "url": url, "records": str(records), "master_pid": proc.pid,
        "started_at": time.time(), "max_duration_s": max_s, "stop_timeout_s": stop_s,
        "note": CO_NOTE,
    }  # fmt: skip
    run = _Run(proc, run_dir, info, dist)
    _RUNNING[str(run_dir)] = run
    (run_dir / "load.pid").write_text(str(proc.pid), encoding="utf-8")
    run.write()
    run.thread.start()
    log.warning("locust load: %s", CO_NOTE)
    if dist is not None:  # the workers first: the users start when they have all connected
        try:
            dist.start_job(configuration, max_s, stop_s)
            dist.wait_for_workers(proc, run_dir, str(lf))
        except BaseException:
            stop_locust(configuration)
            raise
        run.write()
    t0 = time.monotonic()
    deadline = t0 + warm
    first_ok_by = t0 + max(warm, startup_timeout_s)
    while True:
        now = time.monotonic()
        if now >= deadline and (now >= first_ok_by or _count_ok(records) > 0):
            break
        if proc.poll() is not None:
            stop_locust(configuration)
            raise InterruptExecution(
                f"locust exited with code {proc.returncode} during warm-up; see "
                f"{run_dir / 'locust.out'} and {run_dir / 'locust.log'}"
            )
        time.sleep(0.2)
    if _count_ok(records) == 0:
        stop_locust(configuration)
        raise InterruptExecution(
            f"no Locust request to {url} succeeded within {max(warm, startup_timeout_s):g} s (does "
            f"{lf.name} use chaoslib_infer.locust.user? see {run_dir / 'locust.log'})"
        )
    return {
        "engine": "locust", "pid": proc.pid, "records": str(records), "url": url,
        "users": users, "spawn_rate": rate, "processes": processes, "note": CO_NOTE,
    }  # fmt: skip


def stop_locust(
    configuration: dict[str, Any] | None = None, grace_s: float = 20.0
) -> dict[str, Any] | None:
    """Stop this run's Locust (SIGTERM to its process group, SIGKILL after ``grace_s``) and
    report what it ran.

    Returns:
        ``locust.json``'s content: the start arguments, ``note``, ``worker_pids``,
        ``workers_lost`` (``[{"pid", "found_dead_at"}]``, unix s), ``missing_worker_log`` (Locust's
        log lines about missing or failed workers), ``exit_code``, ``stopped_at``; None when no
        Locust was running for this run.
    """
    run_dir = settings.run_dir(configuration)
    run = _RUNNING.pop(str(run_dir), None)
    if run is None:
        return None
    try:
        _stop(run, grace_s)
    finally:
        if run.dist is not None:  # the workers' Job goes with the drill, whatever happened
            run.dist.delete_job()
            run.write()
    return dict(run.info)


def _stop(run: _Run, grace_s: float) -> None:
    run_dir = run.run_dir
    proc = run.proc
    if run.dist is not None:  # the master first stops its workers, who send their last records
        grace_s = max(grace_s, float(run.info.get("stop_timeout_s") or 0) + 15.0)
    # a last look before the stop, so that a worker killed just before is still counted
    for pid in run.workers:
        if pid not in run.lost and not _alive(pid):
            run.lost[pid] = time.time()
    run.stopping.set()
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    run.thread.join(2)
    lines: list[str] = []
    with contextlib.suppress(OSError):
        text = (run_dir / "locust.log").read_text(encoding="utf-8", errors="replace")
        lines = [ln.strip() for ln in text.splitlines() if _MISSING.search(ln)][:50]
    if run.dist is not None:
        run.write()
        _log_workers(run)
    if run.lost:
        log.warning(
            "locust load: %d of %d worker(s) died during the drill: %s",
            len(run.lost), len(run.workers), ", ".join(map(str, sorted(run.lost))),
        )  # fmt: skip
    run.write(missing_worker_log=lines, exit_code=proc.returncode, stopped_at=time.time())
    (run_dir / "load.pid").unlink(missing_ok=True)


def _log_workers(run: _Run) -> None:
    workers = run.info.get("workers") or []
    for w in workers:
        log.info(
            "locust load: worker %s (%s, pid %s) delivered %d record(s) in %d report(s)%s",
            w.get("index"), w.get("host"), w.get("pid"), w.get("records_delivered") or 0,
            w.get("reports") or 0, "" if w.get("last_report_delivered") else
            " (its last report never came)",
        )  # fmt: skip
    lost = run.info.get("workers_lost") or []
    if lost:
        log.warning(
            "locust load: %d of %d Locust worker(s) lost during the drill: %s",
            len(lost), len(workers), ", ".join(f"{w.get('host')} ({w.get('reason')})" for w in lost),
        )  # fmt: skip


def before_experiment_control(
    context: dict[str, Any],
    configuration: dict[str, Any] | None = None,
    **arguments: Any,
) -> None:
    """Chaos Toolkit hook: start Locust before the experiment (arguments of
    :func:`start_locust`; ``engine`` and unknown keys are ignored)."""
    allowed = {
        "locustfile", "users", "spawn_rate", "processes", "warmup_s", "max_duration_s",
        "stop_timeout_s", "extra_args", "startup_timeout_s", "distributed",
    }  # fmt: skip
    kwargs = {k: v for k, v in arguments.items() if k in allowed}
    if "locustfile" not in kwargs:
        raise InterruptExecution("locust load: 'locustfile' is required")
    with settings.load_error_saved(configuration):
        start_locust(configuration=configuration, **kwargs)


def after_experiment_control(
    context: dict[str, Any],
    state: Any = None,
    configuration: dict[str, Any] | None = None,
    **arguments: Any,
) -> None:
    """Chaos Toolkit hook: stop Locust after the experiment and its rollbacks."""
    stop_locust(configuration)
