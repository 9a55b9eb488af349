"""The local lab fleet: N engine replicas behind HAProxy, supervised by supervisord.

Layout of ``state_dir`` (nothing is written outside it, apart from the lab's cgroups)::

    lab.json                 url, ports, pids, cgroup paths, engine (read by :meth:`Lab.attach`)
    supervisord.conf/.log    supervisord configuration and its own log (exit statuses)
    supervisor.sock          supervisord XML-RPC (unix socket)
    haproxy.cfg, haproxy.sock  HAProxy configuration and admin stats socket
    haproxy-requests.log     one line per request through HAProxy (ground truth, any engine)
    ledger.jsonl             engine ledger, shared by every replica (ground truth, sim engine)
    events.jsonl             start / ready / exit / fault records (ground truth)
    faults.json              active faults: the rollback ledger (every kind, see add_fault)
    admin-token              per-lab random token of the sim engines' fault control plane
                             (mode 0600; the state directory itself is made 0700)
    engine-faults/<r>.json   crash faults armed on sim replica r: re-armed when it restarts
    placement.json           replica -> node (labs with nodes; see chaoslib_infer.lab.nodes)
    logs/                    replica, HAProxy stderr and recorder logs

Process tree: ``supervisord`` (in cgroup ``ctl``) supervises every replica (``cgexec`` moves
each into its own memory-limited cgroup ``rN`` and execs the engine, so restarts rejoin it),
HAProxy in the foreground, and the recorder (event listener writing ``events.jsonl``).

The class is the lab's public surface: what drills, nodes, scaling, the dead-man, the registry and
the game day use. Its work is done in modules of their own, each importable alone:

- :mod:`~chaoslib_infer.lab.lifecycle`: up / attach / wait / down;
  :mod:`~chaoslib_infer.lab.render`: haproxy.cfg and supervisord.conf;
  :mod:`~chaoslib_infer.lab.engines`: the replicas' engine commands;
- :mod:`~chaoslib_infer.lab.faults`: the fault ledger (``faults.json``);
  :mod:`~chaoslib_infer.lab.oom`: the oom-kill fault;
  :mod:`~chaoslib_infer.lab.groundtruth`: ``events.jsonl`` and the first request served;
- leaves shared with the rest of the lab: :mod:`~chaoslib_infer.lab.statedir` (file names,
  limits, :class:`LabError`), :mod:`~chaoslib_infer.lab.processes` (pids),
  :mod:`~chaoslib_infer.lab.supervisor_rpc` (supervisord XML-RPC), :mod:`~chaoslib_infer.lab.ports`.
- nodes and scaling act on a lab through this class: :mod:`~chaoslib_infer.lab.topology` (bring-up
  and teardown of nodes), :mod:`~chaoslib_infer.lab.nodeloss` (``lose_node``); the scaling modules
  are never imported here.

Every name this module exported before the split is still importable from here.
"""

from __future__ import annotations

import subprocess
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from chaoslib_infer.lab import (
    faults,
    groundtruth,
    lifecycle,
    netns,
    nodeloss,
    procfs,
    topology,
)
from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.lab.cgroups import MemoryCgroup
from chaoslib_infer.lab.engines import (
    ENGINES,
    HEALTH_PATHS,
    EngineBuilder,
    cli_args,
    engine_command,
    health_path,
    register_engine,
)
from chaoslib_infer.lab.oom import oom_kill
from chaoslib_infer.lab.ports import http_status
from chaoslib_infer.lab.processes import PACKAGE_PARENT, alive, is_hog, kill, wait_dead
from chaoslib_infer.lab.statedir import (
    ADMIN_TOKEN_FILE,
    DEFAULT_FAULT_TTL_S,
    FAULTS_FILE,
    HAPROXY_SOCK,
    LAB_FILE,
    LEDGER_FILE,
    MAX_REPLICAS,
    MIN_MEMORY_MB,
    REQUEST_LOG,
    SUPERVISOR_SOCK,
    TICK_S,
    LabError,
)
from chaoslib_infer.lab.supervisor_rpc import RPC_ERRORS, rpc

__all__ = [
    "ADMIN_TOKEN_FILE",
    "DEFAULT_FAULT_TTL_S",
    "ENGINES",
    "FAULTS_FILE",
    "HAPROXY_SOCK",
    "HEALTH_PATHS",
    "LAB_FILE",
    "LEDGER_FILE",
    "MAX_REPLICAS",
    "MIN_MEMORY_MB",
    "REQUEST_LOG",
    "SUPERVISOR_SOCK",
    "TICK_S",
    "EngineBuilder",
    "Lab",
    "LabError",
    "cli_args",
    "engine_command",
    "health_path",
    "register_engine",
]

# Compatibility aliases: private names other modules imported from here before the split
# (issue #12). Code in this tree uses the public functions; these stay until the other
# branches of that issue are merged.
_PACKAGE_PARENT = PACKAGE_PARENT
_alive = alive
_wait_dead = wait_dead
_kill = kill
_is_hog = is_hog
_rpc = rpc
_cli_args = cli_args


class Lab:
    """Handle on a running (or stopped) lab in ``state_dir``; see the module docstring.

    Attributes:
        state_dir: the lab's state directory (absolute).
        meta: the lab's ``lab.json`` mapping (replicas, ports, cgroups, nodes, pids...).
        supervisord_process: the supervisord process this handle started (:meth:`up`), or None
            (a lab found by :meth:`attach`).
    """

    state_dir: Path

    def __init__(self, state_dir: Path, meta: dict[str, Any]) -> None:
        """Wrap an existing lab; use :meth:`up` or :meth:`attach` instead."""
        self.state_dir = state_dir
        self.meta = meta
        self.supervisord_process: subprocess.Popen[bytes] | None = None

    # -- lifecycle (chaoslib_infer.lab.lifecycle) ---------------------------------------------
    #: Start a lab and wait until every replica is ready and HAProxy answers
    #: (:func:`chaoslib_infer.lab.lifecycle.up` documents the arguments): ``Lab.up(state_dir, ...)``.
    up = classmethod(lifecycle.up)

    @classmethod
    def attach(cls, state_dir: Path) -> Lab:
        """Handle on the lab described by ``state_dir/lab.json``.

        Raises:
            LabError: no lab.json there (or unreadable).
        """
        state_dir = Path(state_dir).resolve()
        return cls(state_dir, lifecycle.read_meta(state_dir))

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Block until every replica is ready and HAProxy sees it UP (between drills).

        Raises:
            LabError: not healthy within ``timeout_s`` seconds (message says what is not ready).
        """
        lifecycle.wait_healthy(self, timeout_s)

    def down(self) -> None:
        """Stop supervisord and everything it runs, kill strays in the lab cgroups, remove them.

        Idempotent; safe on a half-started lab.

        Raises:
            LabError: something could not be removed (the message lists what).
        """
        lifecycle.down(self)

    # -- accessors -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """HAProxy frontend URL, e.g. ``http://127.0.0.1:8800``."""
        return str(self.meta["url"])

    def replica_names(self) -> list[str]:
        """``["r0", "r1", ...]``: the serving replicas at start (standby replicas left out)."""
        return [r["name"] for r in self.meta["replicas"] if not r.get("standby")]

    def engine_name(self) -> str:
        """Engine the replicas run (``"sim"`` | ``"llama-cpp"``)."""
        return str(self.meta["engine"])

    def health_path(self) -> str:
        """GET path that answers 200 once a replica serves (``lab.json``; ``/health`` default)."""
        return str(self.meta.get("health_path") or "/health")

    def replica(self, name: str) -> dict[str, Any]:
        """A copy of replica ``name``'s ``lab.json`` entry (``name``, ``port``, ``cgroup``, and
        ``standby``, ``node``, ``host`` where set); standby replicas included.

        Raises:
            LabError: no such replica.
        """
        for rep in self.meta["replicas"]:
            if rep["name"] == name:
                return dict(rep)
        raise LabError(f"unknown replica {name!r}; the lab has {', '.join(self.replica_names())}")

    def replica_cgroup(self, name: str) -> MemoryCgroup:
        """Replica ``name``'s memory cgroup.

        Raises:
            LabError: no such replica.
        """
        return MemoryCgroup(Path(self.replica(name)["cgroup"]), int(self.meta["cgroup_version"]))

    def replica_host(self, name: str) -> str:
        """Address replica ``name`` listens on: its node's IP, or 127.0.0.1 without nodes."""
        if not self.meta.get("nodes"):
            return "127.0.0.1"
        return netns.replica_host(self.state_dir, name)

    def replica_pid(self, name: str) -> int | None:
        """Current pid of a replica's engine (None when not running).

        Raises:
            LabError: no such replica.
        """
        self.replica(name)
        info = self.process_infos().get(name)
        return int(info["pid"]) if info and info.get("pid") else None

    def admin_token(self) -> str | None:
        """The lab's admin token for the sim engines' fault control plane, or None.

        Sent as ``X-Chaos-Admin-Token`` to a replica's ``/admin/faults`` (see
        :mod:`chaoslib_infer.lab.engine`, "Fault modes"). None when the lab has no token file (a lab
        started by an older version; its engines then answer loopback peers only). Never log it.
        """
        try:
            lines = (self.state_dir / ADMIN_TOKEN_FILE).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            return None
        return (lines[0].strip() or None) if lines else None

    # -- supervisord -----------------------------------------------------------------------
    def supervisord_pid(self) -> int | None:
        """The pid ``lab.json`` records for the lab's supervisord (it may be gone)."""
        pid = self.meta.get("pids", {}).get("supervisord")
        return int(pid) if pid else None

    def supervisord_alive(self) -> bool:
        """True while the lab runs: its recorded supervisord pid is alive and runs *this* lab's
        configuration (pids are reused: a stale one may belong to another lab now)."""
        pid = self.supervisord_pid()
        cmdline = procfs.cmdline(pid or 0)
        return (
            bool(pid) and alive(pid) and "supervisord" in cmdline and str(self.state_dir) in cmdline
        )

    def process_infos(self) -> dict[str, dict[str, Any]]:
        """supervisord's ``getAllProcessInfo`` by program name (``statename``, ``pid``,
        ``spawnerr``...); ``{}`` when supervisord does not answer within 2 s."""
        try:
            return {p["name"]: p for p in rpc(self.state_dir, 2.0).supervisor.getAllProcessInfo()}
        except RPC_ERRORS:
            return {}

    # -- status ----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """JSON-able snapshot: url, engine, running, replicas[...], haproxy, active_faults.

        Each replica carries ``engine_faults``: the fault modes its sim engine has armed, asked
        of the engine itself (:func:`chaoslib_infer.lab.engine_admin.armed`; ``[]`` when none or
        not running, ``None`` for another engine or a stopped lab), and ``engine_faults_error``
        when the engine could not be asked. ``active_faults`` is the lab's fault ledger (every
        kind), each record checked by its module.
        """
        running = self.supervisord_alive()
        engine_faults: dict[str, Any] = {}
        if running and self.engine_name() == "sim":
            # not at module level: engine_admin imports the sim engine (its web stack), which
            # the lab's helper processes (watchdog, node controller, autoscaler) never need
            from chaoslib_infer.lab import engine_admin

            engine_faults = engine_admin.lab_engine_faults(self)
        infos = self.process_infos() if running else {}
        try:
            stats = hap.show_stat(self.state_dir / HAPROXY_SOCK) if running else {}
        except OSError:
            stats = {}
        starts: dict[str, int] = {}
        for ev in self.events():
            if ev.get("event") == "start":
                starts[ev["replica"]] = starts.get(ev["replica"], 0) + 1
        reps = []
        for rep in self.meta["replicas"]:
            name = rep["name"]
            info = infos.get(name, {})
            cg = self.replica_cgroup(name)
            srv = stats.get(name, {})
            reps.append(
                {
                    "name": name,
                    "port": rep["port"],
                    "pid": info.get("pid") or None,
                    "state": info.get("statename", "DOWN" if not running else "UNKNOWN"),
                    "healthy": running
                    and http_status(
                        int(rep["port"]), self.health_path(), 0.5, self.replica_host(name)
                    )
                    == 200,
                    "host": self.replica_host(name),
                    "haproxy_status": srv.get("status") or None,
                    "cgroup": rep["cgroup"],
                    "memory_bytes": cg.usage_bytes(),
                    "memory_limit_bytes": cg.limit_bytes(),
                    "oom_kills": cg.oom_kills(),
                    "restarts": max(0, starts.get(name, 0) - 1),
                    "standby": bool(rep.get("standby")),
                    **_engine_fault_fields(engine_faults.get(name)),
                }
            )
        hinfo = infos.get("haproxy", {})
        node_info: dict[str, Any] = {}
        if self.meta.get("nodes"):
            node_info["nodes"] = topology.node_status(self)
        return {
            "url": self.url,
            "engine": self.engine_name(),
            "lab_id": self.meta["lab_id"],
            "state_dir": str(self.state_dir),
            "running": running,
            "supervisord_pid": self.supervisord_pid() if running else None,
            "haproxy": {"pid": hinfo.get("pid") or None, "state": hinfo.get("statename", "DOWN")},
            "gateway": self.meta.get("gateway", "haproxy"),
            "cgroup_version": self.meta["cgroup_version"],
            "replicas": reps,
            **node_info,
            "active_faults": self.active_faults(),
        }

    # -- faults (chaoslib_infer.lab.faults, chaoslib_infer.lab.oom) -------------------------
    def edit_faults(self) -> AbstractContextManager[list[dict[str, Any]]]:
        """Locked read-modify-write of the fault ledger: ``with lab.edit_faults() as records:``
        change the list in place; it is written back durably on exit (:func:`faults.edit`)."""
        return faults.edit(self.state_dir)

    def active_faults(self) -> list[dict[str, Any]]:
        """The ledger's records still in effect, each checked by its module (a refused record is
        listed with ``refused``; an unknown state counts as active): see :func:`faults.active`."""
        return faults.active(self)

    def add_fault(self, record: dict[str, Any]) -> str:
        """Record an active fault in ``faults.json`` *before* it is injected (the rollback ledger).

        Args:
            record: JSON-able mapping with at least ``kind`` and ``module``: the module that injected
                it, which must define ``undo_fault(lab, record) -> str | None`` (idempotent; returns a
                description of what it undid) and ``fault_active(lab, record) -> bool``. Put in it
                everything the undo needs (pids, paths, previous values). ``injected_at`` is added,
                and ``ttl_s`` (:data:`DEFAULT_FAULT_TTL_S` when absent): the lab's dead-man
                watchdog undoes the fault once ``injected_at + ttl_s`` has passed, even if the
                runner that injected it was killed (``chaoslib_infer.lab.deadman``).

        Returns:
            The fault id (also stored as ``record["id"]``).

        Raises:
            LabError: no ``kind`` or ``module``, or a ``ttl_s`` that is not a positive number.
        """
        return faults.add(self, record)

    def remove_fault(self, fault_id: str, undo: bool = True) -> str | None:
        """Undo (unless ``undo`` is False) and forget one recorded fault. Unknown id: ``None``.

        Raises:
            LedgerRefused: the record does not validate (it stays in the ledger).
            Exception: whatever its module's ``undo_fault`` raises (it stays in the ledger).
        """
        return faults.remove(self, fault_id, undo)

    def clear_faults(self) -> list[str]:
        """Undo every recorded fault (each through its module's ``undo_fault``) and kill leftover
        memory hogs (faults.json and any hog found in replica cgroups). Returns what was undone."""
        return faults.clear(self)

    def oom_kill(self, replica: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """Make the kernel OOM-kill ``replica``'s engine with a memory hog in its cgroup.

        Same as :func:`chaoslib_infer.lab.oom.oom_kill` on this lab: returns its dict (the
        unix time ``fault_at`` the kill was observed, the pids, the cgroup) and raises its
        :class:`LabError` (unknown or stopped replica, a fault already active, no kill within
        ``timeout_s`` seconds).
        """
        return oom_kill(self, replica, timeout_s)

    def lose_node(
        self, node: str = "auto", down_s: float = 60.0, reschedule_after_s: float = 3.0
    ) -> dict[str, Any]:
        """Lose a whole node (network cut, replicas killed; rescheduled onto a spare node after
        ``reschedule_after_s``, node back after ``down_s``): see :mod:`chaoslib_infer.lab.nodes`.

        Raises:
            LabError: see :func:`chaoslib_infer.lab.nodes.lose_node`.
        """
        return nodeloss.lose_node(self, node, down_s, reschedule_after_s)

    # -- ground truth (chaoslib_infer.lab.groundtruth) ----------------------------------------
    def events(self) -> list[dict[str, Any]]:
        """Ground-truth records from ``events.jsonl`` in file order."""
        return groundtruth.events(self.state_dir)

    def fault_event(
        self, replica: str | None, phase: str, kind: str | None = "oom-kill", **extra: Any
    ) -> None:
        """Append a ``{"event": "fault", "kind", "replica", "phase", ...}`` ground-truth event."""
        groundtruth.fault_event(self.state_dir, replica, phase, kind, **extra)

    def served(self, replica: str, after: float) -> float | None:
        """Unix time of the first request ``replica`` served after ``after`` (None if none yet).

        Combines the engine ledger (generation start) and HAProxy's request log (time the request
        reached the server, 2xx/3xx answers only); the earliest wins.

        Raises:
            LabError: no such replica.
        """
        self.replica(replica)
        return groundtruth.served(self.state_dir, replica, after)


def _engine_fault_fields(answer: Any) -> dict[str, Any]:
    """A replica's ``engine_faults`` (and ``engine_faults_error``) fields of :meth:`Lab.status`."""
    if isinstance(answer, list):
        return {"engine_faults": answer}
    if isinstance(answer, dict):
        return {"engine_faults": None, "engine_faults_error": str(answer.get("error"))}
    return {"engine_faults": None}
