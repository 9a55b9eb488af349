"""Lab *nodes*: replicas grouped into network namespaces, and the loss of a whole node.

``Lab.up(..., nodes=N)`` (``chaos-infer lab up --nodes N``) spreads the replicas round-robin over
``N`` nodes ``n0..n{N-1}`` and, with ``spare_node=True`` (the default when ``N >= 1``), adds one empty
**spare node** ``nN``. Each node is a network namespace with a veth pair to the root namespace
(:mod:`chaoslib_infer.lab.netns`); its replicas listen on the node address, where HAProxy (root
namespace), the lab's readiness checks and the recorder's health poller reach them.

Losing a node (:func:`lose_node`, ``Lab.lose_node``), the way a compute node drops:

1. the fault is recorded with ``lab.add_fault`` (kind ``node-loss``, module this one) and the
   node controller is started (see below), both *before* anything is touched;
2. the node's network is cut (its veth set down inside the namespace): ``node_down`` event, the
   fault time ``fault_at``;
3. its replicas are frozen (SIGSTOP), told to stop through supervisord (so that supervisord does not
   restart them: autorestart only applies to unexpected exits) and SIGKILLed at once: they die
   without a chance to answer or close a connection, and their RSTs would not cross the cut link;
4. after ``reschedule_after_s`` (the orchestrator's eviction grace period) the controller moves the
   lost replicas to a spare node: placement updated, HAProxy's server pointed at the new address
   (runtime API ``set server engines/rX addr IP port P`` + ``enable server``, and haproxy.cfg
   rewritten so a HAProxy restart keeps it), the replica started there: ``rescheduled`` event
   (from node, to node); ``serving`` event with the time of the first request it served there.
   The controller also records when HAProxy ejects a lost replica (``lb_ejected``: DOWN after its
   health checks failed) and takes a moved one back (``lb_up``: UP at its new address).
   A spare node is an up node holding no replica; without one the replicas stay pending
   (``reschedule_blocked`` event) until their node comes back, like pods without capacity;
5. after ``down_s`` the controller brings the node back (``node_up``, ``by: "dead-man timer"``) and
   restarts there the replicas that were not moved (a moved replica stays where it is; the node
   returns empty and becomes the next spare).

**Dead-man**: the node controller is a small detached process (``python -m
chaoslib_infer.lab.nodes --state-dir D --fault-id ID``, in the lab's ``ctl`` cgroup, log
``logs/node-controller.log``) that owns steps 4 and 5, so if the drill runner dies the node still
comes back after ``down_s`` and the replicas still move. It stops early when the fault record leaves
``faults.json`` (rolled back) and exits at the latest ``max(down_s, reschedule_after_s) + 120`` s
after the fault. ``lab down`` kills it (cgroup) and deletes the namespaces anyway. Second line of
defence, if the controller itself dies: the fault record's ``ttl_s`` (``max(down_s,
reschedule_after_s) + 30``) for the lab's watchdog (:mod:`chaoslib_infer.safety.deadman`), which
then runs :func:`undo_fault`.

The rollback (:func:`undo_fault`, through ``lab.clear_faults()`` / ``lab.remove_fault``) kills the
controller, restores the node's network, points HAProxy at wherever each lost replica is placed,
enables it and starts every lost replica that is not running: the lab is whole again.

All times are unix seconds; ground-truth events go to ``state_dir/events.jsonl``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import xmlrpc.client
from pathlib import Path
from typing import Any

from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.lab import netns, procfs
from chaoslib_infer.lab.fleet import (
    _PACKAGE_PARENT,
    FAULTS_FILE,
    HAPROXY_SOCK,
    Lab,
    LabError,
    _alive,
    _rpc,
    _wait_dead,
)
from chaoslib_infer.lab.netns import NetnsError
from chaoslib_infer.lab.recorder import EVENTS_FILE, append_event
from chaoslib_infer.safety import registry
from chaoslib_infer.safety.redact import child_env

__all__ = [
    "FAULT_KIND",
    "MAX_NODES",
    "fault_active",
    "haproxy_config",
    "lose_node",
    "main",
    "node_status",
    "plan_nodes",
    "program_command",
    "setup_nodes",
    "teardown_nodes",
    "undo_fault",
    "validate_nodes",
]

FAULT_KIND = "node-loss"
MODULE = "chaoslib_infer.lab.nodes"
MAX_NODES = 16
CONTROLLER_GRACE_S = 120.0
SERVING_WAIT_S = 60.0
_ALREADY_STARTED = 60  # supervisord xmlrpc fault codes
_NOT_RUNNING = 70


# --------------------------------------------------------------------------------------------
# Bring-up and teardown (called by Lab.up / Lab.down)
# --------------------------------------------------------------------------------------------
def validate_nodes(
    nodes: int | None, spare_node: bool | None, engine_argv: list[str]
) -> tuple[int, bool]:
    """Check ``Lab.up``'s ``nodes``/``spare_node`` and return ``(nodes, spare)``.

    Args:
        nodes: ``None`` or 0 for no nodes (loopback lab), else 1..``MAX_NODES``.
        spare_node: add one empty spare node; ``None`` means "yes when nodes >= 1".
        engine_argv: a sample engine command (it must take ``--host``).

    Raises:
        LabError: out of range, ``ip`` missing, or an engine without ``--host``.
    """
    if nodes is None or nodes == 0:
        return 0, False
    if not isinstance(nodes, int) or isinstance(nodes, bool) or not 1 <= nodes <= MAX_NODES:
        raise LabError(f"nodes must be between 0 and {MAX_NODES}, got {nodes!r}")
    if spare_node is not None and not isinstance(spare_node, bool):
        raise LabError(f"spare_node must be true or false, got {spare_node!r}")
    try:
        netns.find_ip()
        netns.rehost_argv(engine_argv, "0.0.0.0")
    except NetnsError as exc:
        raise LabError(str(exc)) from exc
    return nodes, True if spare_node is None else spare_node


def plan_nodes(meta: dict[str, Any], nodes: int, spare: bool) -> None:
    """Add the node layout to a lab's ``meta`` (``meta["nodes"]``, each replica's node and host).

    Raises:
        LabError: no free ``10.213.X.0/24`` network, or ``ip`` failed.
    """
    lab_id = str(meta["lab_id"])
    try:
        x = netns.pick_subnet(lab_id)
    except NetnsError as exc:
        raise LabError(str(exc)) from exc
    layout: list[dict[str, Any]] = []
    for i in range(nodes + (1 if spare else 0)):
        name = f"n{i}"
        root_ip, ip = netns.node_addresses(x, i)
        veth_root, veth_node = netns.veth_names(lab_id, i)
        layout.append(
            {
                "name": name,
                "index": i,
                "ns": netns.ns_name(lab_id, name),
                "veth_root": veth_root,
                "veth_node": veth_node,
                "root_ip": root_ip,
                "ip": ip,
                "spare": i >= nodes,
            }
        )
    meta["nodes"] = layout
    meta["node_subnet"] = x
    for k, rep in enumerate(meta["replicas"]):
        node = layout[k % nodes]
        rep["node"] = node["name"]
        rep["host"] = node["ip"]


def setup_nodes(lab: Lab) -> None:
    """Create every node's namespace and veth, the guard route, and the initial placement.

    Raises:
        LabError: ``ip`` failed or namespaces are not permitted (caller tears down).
    """
    meta = lab.meta
    try:
        netns.add_guard_route(int(meta["node_subnet"]))
        for node in meta["nodes"]:
            netns.create_node(
                node["ns"], node["veth_root"], node["veth_node"], node["root_ip"], node["ip"]
            )
    except NetnsError as exc:
        raise LabError(str(exc)) from exc
    by_name = {n["name"]: n for n in meta["nodes"]}
    with netns.update_placement(lab.state_dir) as placement:
        placement.clear()
        for rep in meta["replicas"]:
            node = by_name[rep["node"]]
            placement[rep["name"]] = {"node": node["name"], "ns": node["ns"], "host": node["ip"]}


def program_command(state_dir: Path, rep: dict[str, Any], cmd: list[str]) -> list[str]:
    """supervisord command of a replica on a node: the :mod:`~chaoslib_infer.lab.netns` wrapper."""
    return [
        sys.executable,
        "-m",
        "chaoslib_infer.lab.netns",
        "--state-dir",
        str(state_dir),
        "--replica",
        str(rep["name"]),
        "--cgroup",
        str(rep["cgroup"]),
        "--",
        *cmd,
    ]


def haproxy_config(text: str, servers: dict[str, tuple[str, int]]) -> str:
    """Point the ``server NAME ADDR:PORT`` lines of a rendered haproxy.cfg at ``{name: (host, port)}``.

    Raises:
        LabError: a server line is missing (or present twice).
    """
    for name, (host, port) in servers.items():
        pattern = re.compile(rf"^(\s*server\s+{re.escape(name)}\s+)\S+(\s)", re.M)
        address = f"{host}:{port}"
        text, count = pattern.subn(lambda m: f"{m[1]}{address}{m[2]}", text)  # noqa: B023
        if count != 1:
            raise LabError(f"haproxy.cfg has {count} server lines for {name}, expected 1")
    return text


def teardown_nodes(meta: dict[str, Any]) -> list[str]:
    """Delete the lab's namespaces, veths and guard route, and its placement; idempotent.

    Returns:
        What could not be removed (empty when everything is gone).
    """
    nodes = meta.get("nodes") or []
    if not nodes:
        return []
    errors: list[str] = []
    try:
        for node in nodes:
            errors += netns.delete_node(node["ns"], node["veth_root"])
        for stray in netns.list_namespaces(f"{netns.NS_PREFIX}-{meta['lab_id']}-"):
            with contextlib.suppress(NetnsError):
                netns.run_ip("netns", "del", stray)
        if meta.get("node_subnet") is not None:
            netns.delete_guard_route(int(meta["node_subnet"]))
    except NetnsError as exc:
        errors.append(str(exc))
    with contextlib.suppress(OSError):
        (Path(meta["state_dir"]) / netns.PLACEMENT_FILE).unlink()
    return errors


# --------------------------------------------------------------------------------------------
# Inspection
# --------------------------------------------------------------------------------------------
def _nodes(lab: Lab) -> list[dict[str, Any]]:
    nodes = lab.meta.get("nodes") or []
    if not nodes:
        raise LabError(
            "the lab has no nodes; bring it up with nodes >= 1 (chaos-infer lab up --nodes 3, "
            "or `nodes: 3` in the plan's lab section)"
        )
    return list(nodes)


def _node(lab: Lab, name: str) -> dict[str, Any]:
    for node in _nodes(lab):
        if node["name"] == name:
            return dict(node)
    raise LabError(
        f"unknown node {name!r}; the lab has {', '.join(n['name'] for n in _nodes(lab))}"
    )


def _node_up(node: dict[str, Any]) -> bool | None:
    try:
        return netns.link_is_up(node["ns"], node["veth_node"])
    except NetnsError:
        return None


def _all_replicas(lab: Lab) -> list[str]:
    """Every configured replica, standby ones (autoscaler) included."""
    return [str(r["name"]) for r in lab.meta["replicas"]]


def _placed_on(lab: Lab, node: str) -> list[str]:
    placement = netns.read_placement(lab.state_dir)
    return [r for r in _all_replicas(lab) if (placement.get(r) or {}).get("node") == node]


def node_status(lab: Lab) -> list[dict[str, Any]]:
    """``[{"name", "ns", "ip", "spare", "up", "replicas"}]`` (``up`` None: namespace gone)."""
    placement = netns.read_placement(lab.state_dir)
    out = []
    for node in lab.meta.get("nodes") or []:
        out.append(
            {
                "name": node["name"],
                "ns": node["ns"],
                "ip": node["ip"],
                "spare": bool(node.get("spare")),
                "up": _node_up(node),
                "replicas": [
                    r
                    for r in _all_replicas(lab)
                    if (placement.get(r) or {}).get("node") == node["name"]
                ],
            }
        )
    return out


def _event(lab: Lab, record: dict[str, Any]) -> None:
    append_event(lab.state_dir / EVENTS_FILE, record)


def _states(lab: Lab) -> dict[str, str]:
    try:
        infos = _rpc(lab.state_dir, 2.0).supervisor.getAllProcessInfo()
    except (OSError, xmlrpc.client.Error, http.client.HTTPException):
        return {}
    return {p["name"]: str(p["statename"]) for p in infos}


# --------------------------------------------------------------------------------------------
# HAProxy and supervisord moves
# --------------------------------------------------------------------------------------------
def _point_haproxy(lab: Lab, replica: str, host: str, port: int) -> None:
    """Runtime API: server ``replica`` at ``host:port`` and enabled; haproxy.cfg rewritten too.

    Raises:
        LabError: HAProxy refused the change or its socket is gone.
    """
    sock = lab.state_dir / HAPROXY_SOCK
    try:
        answer = hap.stats_command(sock, f"set server engines/{replica} addr {host} port {port}")
        hap.stats_command(sock, f"enable server engines/{replica}")
    except OSError as exc:
        raise LabError(f"haproxy runtime API ({sock}): {exc}") from exc
    low = answer.lower()
    if "no such" in low or "unknown" in low or "require" in low or "invalid" in low:
        raise LabError(f"haproxy refused to move {replica}: {answer.strip()}")
    cfg = lab.state_dir / "haproxy.cfg"
    with contextlib.suppress(OSError):
        text = haproxy_config(cfg.read_text(), {replica: (host, port)})
        tmp = cfg.with_name(cfg.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, cfg)


def _start_replica(lab: Lab, replica: str) -> bool:
    """Start a stopped replica through supervisord; False when it already runs."""
    try:
        _rpc(lab.state_dir, 5.0).supervisor.startProcess(replica, False)
    except xmlrpc.client.Fault as exc:
        if exc.faultCode == _ALREADY_STARTED:
            return False
        raise LabError(f"supervisord could not start {replica}: {exc.faultString}") from exc
    except (OSError, http.client.HTTPException) as exc:
        raise LabError(f"supervisord not answering: {exc}") from exc
    return True


def _free_spare(lab: Lab, exclude: str) -> dict[str, Any] | None:
    """An up node holding no replica (designated spares first), other than ``exclude``."""
    placement = netns.read_placement(lab.state_dir)
    used = {(e or {}).get("node") for e in placement.values()}
    cands = [n for n in _nodes(lab) if n["name"] != exclude and n["name"] not in used]
    cands.sort(key=lambda n: (not n.get("spare"), int(n["index"])))
    for node in cands:
        if _node_up(node):
            return dict(node)
    return None


def _port(lab: Lab, replica: str) -> int:
    return int(next(r["port"] for r in lab.meta["replicas"] if r["name"] == replica))


def reschedule(lab: Lab, record: dict[str, Any]) -> list[dict[str, Any]]:
    """Move the lost replicas still placed on the lost node (and not running) to a spare node.

    Returns:
        The ``rescheduled`` events written (empty when the node is back, nothing is left to move,
        or there is no spare: then a ``reschedule_blocked`` event is written).

    Raises:
        LabError: HAProxy or supervisord refused.
    """
    lost_node = str(record["node"])
    if _node_up(_node(lab, lost_node)):
        return []
    states = _states(lab)
    placement = netns.read_placement(lab.state_dir)
    todo = [
        r
        for r in record.get("replicas") or []
        if (placement.get(r) or {}).get("node") == lost_node
        and states.get(r) not in ("RUNNING", "STARTING")
    ]
    if not todo:
        return []
    spare = _free_spare(lab, lost_node)
    if spare is None:
        _event(
            lab,
            {
                "t": time.time(),
                "event": "reschedule_blocked",
                "node": lost_node,
                "replicas": todo,
                "reason": "no spare node (an up node holding no replica)",
                "fault_id": record.get("id"),
            },
        )
        return []
    moved: list[dict[str, Any]] = []
    for replica in todo:
        with netns.update_placement(lab.state_dir) as pl:
            pl[replica] = {"node": spare["name"], "ns": spare["ns"], "host": spare["ip"]}
        _point_haproxy(lab, replica, spare["ip"], _port(lab, replica))
        event = {
            "t": time.time(),
            "event": "rescheduled",
            "replica": replica,
            "from_node": lost_node,
            "to_node": spare["name"],
            "host": spare["ip"],
            "fault_id": record.get("id"),
        }
        _event(lab, event)
        _start_replica(lab, replica)
        moved.append(event)
    return moved


def restore(lab: Lab, record: dict[str, Any], by: str) -> list[str]:
    """Bring the lost node's network back and restart the replicas still placed on it.

    Args:
        lab: the lab.
        record: the ``node-loss`` fault record.
        by: who restores (``"dead-man timer"`` or ``"rollback"``), written in the ``node_up`` event.

    Returns:
        What was done (human-readable).
    """
    notes: list[str] = []
    node = _node(lab, str(record["node"]))
    if _node_up(node) is False:
        try:
            netns.set_link(node["ns"], node["veth_node"], True)
        except NetnsError as exc:
            raise LabError(str(exc)) from exc
        _event(
            lab,
            {
                "t": time.time(),
                "event": "node_up",
                "node": node["name"],
                "by": by,
                "fault_id": record.get("id"),
            },
        )
        notes.append(f"node {node['name']} network restored")
    if not lab._supervisord_alive():
        return notes
    placement = netns.read_placement(lab.state_dir)
    states = _states(lab)
    for replica in record.get("replicas") or []:
        entry = placement.get(replica) or {}
        host = str(entry.get("host") or node["ip"])
        if states.get(replica) not in ("RUNNING", "STARTING"):
            _point_haproxy(lab, replica, host, _port(lab, replica))
            if _start_replica(lab, replica):
                notes.append(f"{replica} started on {entry.get('node', node['name'])}")
    return notes


# --------------------------------------------------------------------------------------------
# The fault
# --------------------------------------------------------------------------------------------
def _pick_node(lab: Lab, node: str) -> str:
    if node not in ("auto", "", None):
        _node(lab, node)
        return node
    for cand in _nodes(lab):
        if _placed_on(lab, cand["name"]) and _node_up(cand):
            return str(cand["name"])
    raise LabError("no up node holds a replica")


def _update_record(lab: Lab, fault_id: str, **fields: Any) -> None:
    with lab._faults() as faults:
        for f in faults:
            if f.get("id") == fault_id:
                f.update(fields)


def _spawn_controller(lab: Lab, fault_id: str) -> int:
    sd = lab.state_dir
    env = child_env()  # lab children never get the API key
    env["PYTHONPATH"] = os.pathsep.join([_PACKAGE_PARENT, *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    (sd / "logs").mkdir(exist_ok=True)
    with open(sd / "logs" / "node-controller.log", "ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "chaoslib_infer.lab.cgexec",
                "--cgroup",
                str(lab.meta["ctl_cgroup"]),
                "--",
                sys.executable,
                "-m",
                MODULE,
                "--state-dir",
                str(sd),
                "--fault-id",
                fault_id,
            ],
            cwd=sd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return int(proc.pid)


def lose_node(
    lab: Lab, node: str = "auto", down_s: float = 60.0, reschedule_after_s: float = 3.0
) -> dict[str, Any]:
    """Lose a whole node: cut its network, kill its replicas; reschedule and restore later.

    Args:
        lab: a running lab with nodes.
        node: node name (``n0``...) or ``"auto"`` for the first up node holding a replica.
        down_s: seconds until the node comes back by itself (dead-man; the rollback brings it back
            earlier).
        reschedule_after_s: seconds after the loss until the lost replicas are started on a spare
            node (the orchestrator's eviction grace period).

    Returns:
        ``{"fault_id", "node", "ns", "fault_at" (unix s, network cut), "killed_at", "replicas"
        (lost), "killed_pids", "down_s", "reschedule_after_s", "controller_pid", "spare" (the spare
        node free at injection time, or None), "state_dir"}``.

    Raises:
        LabError: no nodes, unknown or already down node, a node without replicas, a replica not
            running, bad durations, or an injection step failed (what was done is undone).
    """
    down_s, reschedule_after_s = float(down_s), float(reschedule_after_s)
    if not down_s > 0 or reschedule_after_s < 0:
        raise LabError(
            f"down_s must be > 0 and reschedule_after_s >= 0, got {down_s}, {reschedule_after_s}"
        )
    _nodes(lab)
    if not lab._supervisord_alive():
        raise LabError(f"the lab in {lab.state_dir} is not running")
    name = _pick_node(lab, node)
    info = _node(lab, name)
    if _node_up(info) is not True:
        raise LabError(f"node {name} is already down")
    infos = lab._process_infos()
    standby = {str(r["name"]) for r in lab.meta["replicas"] if r.get("standby")}
    lost = [  # a standby replica that is not running has nothing to lose
        r
        for r in _placed_on(lab, name)
        if r not in standby or (infos.get(r) or {}).get("statename") == "RUNNING"
    ]
    if not lost:
        raise LabError(f"node {name} runs no replica; nothing to lose")
    pids: dict[str, int] = {}
    for replica in lost:
        pinfo = infos.get(replica) or {}
        if pinfo.get("statename") != "RUNNING" or not pinfo.get("pid"):
            raise LabError(
                f"replica {replica} is not running ({pinfo.get('statename', 'unknown')})"
            )
        pids[replica] = int(pinfo["pid"])
    spare = _free_spare(lab, name)
    fault_id = lab.add_fault(
        {
            "kind": FAULT_KIND,
            "module": MODULE,
            "node": name,
            "ns": info["ns"],
            "veth_node": info["veth_node"],
            "replicas": lost,
            "target_pids": pids,
            "down_s": down_s,
            "reschedule_after_s": reschedule_after_s,
            # the lab watchdog's TTL: after the controller's own dead-man timer
            "ttl_s": max(down_s, reschedule_after_s) + 30.0,
        }
    )
    try:
        controller_pid = _spawn_controller(lab, fault_id)
        _update_record(lab, fault_id, controller_pid=controller_pid)
        netns.set_link(info["ns"], info["veth_node"], False)
        fault_at = time.time()
        _update_record(lab, fault_id, fault_at=fault_at)
        _event(
            lab,
            {
                "t": fault_at,
                "event": "node_down",
                "node": name,
                "ns": info["ns"],
                "replicas": lost,
                "fault_id": fault_id,
            },
        )
        for pid in pids.values():  # freeze all first: nobody runs a signal handler
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGSTOP)
        rpc = _rpc(lab.state_dir, 5.0)
        for replica, pid in pids.items():
            with contextlib.suppress(xmlrpc.client.Fault):  # NOT_RUNNING: already gone
                rpc.supervisor.stopProcess(replica, False)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        for replica, pid in pids.items():
            if not _wait_dead(pid, 5.0):
                raise LabError(f"replica {replica} pid {pid} survived SIGKILL")
        killed_at = time.time()
        deadline = time.monotonic() + 5.0
        while any(_states(lab).get(r) not in ("STOPPED", "EXITED") for r in lost):
            if time.monotonic() > deadline:
                raise LabError(f"supervisord did not mark {', '.join(lost)} stopped")
            time.sleep(0.02)
        _update_record(lab, fault_id, killed_at=killed_at)
    except (NetnsError, OSError, xmlrpc.client.Error, http.client.HTTPException) as exc:
        with contextlib.suppress(Exception):
            lab.remove_fault(fault_id)
        raise LabError(f"node loss of {name} failed and was undone: {exc}") from exc
    except BaseException:
        with contextlib.suppress(Exception):
            lab.remove_fault(fault_id)
        raise
    return {
        "fault_id": fault_id,
        "node": name,
        "ns": info["ns"],
        "fault_at": fault_at,
        "killed_at": killed_at,
        "replicas": lost,
        "killed_pids": pids,
        "down_s": down_s,
        "reschedule_after_s": reschedule_after_s,
        "controller_pid": controller_pid,
        "spare": spare["name"] if spare else None,
        "state_dir": str(lab.state_dir),
    }


def _is_controller(pid: int, fault_id: str) -> bool:
    cmd = procfs.cmdline(pid)
    return _alive(pid) and MODULE in cmd and fault_id in cmd


def _kill_controller(record: dict[str, Any]) -> bool:
    pid = int(record.get("controller_pid") or 0)
    if pid and _is_controller(pid, str(record.get("id"))):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _wait_dead(pid, 5.0)
        return True
    return False


def undo_fault(lab: Lab, record: dict[str, Any]) -> str | None:
    """Rollback of a ``node-loss`` fault (idempotent): stop the controller, bring the node back,
    make sure every lost replica runs and HAProxy points at it (enabled).

    Returns:
        What was undone, or None when nothing was left to undo.

    Raises:
        LabError: the network could not be restored, or supervisord/HAProxy refused a replica.
    """
    notes: list[str] = []
    if _kill_controller(record):
        notes.append("node controller stopped")
    if not lab.meta.get("nodes"):
        return None
    notes += restore(lab, record, by="rollback")
    lost = list(record.get("replicas") or [])
    if lost and lab._supervisord_alive():
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            states = _states(lab)
            if all(states.get(r) == "RUNNING" for r in lost):
                break
            time.sleep(0.05)
        else:
            raise LabError(f"lost replicas not running after the rollback: {_states(lab)}")
    if not notes:
        return None
    return f"node-loss of {record.get('node')}: " + "; ".join(notes)


def fault_active(lab: Lab, record: dict[str, Any]) -> bool:
    """True while the node is down, its controller runs, or a lost replica is not running."""
    pid = int(record.get("controller_pid") or 0)
    if pid and _is_controller(pid, str(record.get("id"))):
        return True
    try:
        node = _node(lab, str(record["node"]))
    except LabError:
        return False
    if _node_up(node) is False:
        return True
    if lab._supervisord_alive():
        states = _states(lab)
        return any(states.get(r) != "RUNNING" for r in record.get("replicas") or [])
    return False


# --------------------------------------------------------------------------------------------
# Node controller (dead-man timer + rescheduler), a detached process per node loss
# --------------------------------------------------------------------------------------------
def _record(state_dir: Path, fault_id: str) -> dict[str, Any] | None:
    try:
        faults = json.loads((state_dir / FAULTS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return next((f for f in faults if f.get("id") == fault_id), None)


def _watch_lb(
    lab: Lab,
    record: dict[str, Any],
    moved: dict[str, float],
    ejected: set[str],
    back_in_lb: set[str],
) -> None:
    """Record when HAProxy ejects a lost replica (``lb_ejected``: first DOWN/MAINT after the loss)
    and when it takes a moved replica back (``lb_up``: first UP at its new address after having
    been ejected; a replica moved before its health checks failed enough is never ejected)."""
    lost = [str(r) for r in record.get("replicas") or []]
    todo = [r for r in lost if r not in ejected or (r in moved and r not in back_in_lb)]
    if not todo:
        return
    try:
        stats = hap.show_stat(lab.state_dir / HAPROXY_SOCK)
    except OSError:
        return
    now = time.time()
    for replica in lost:
        status = str((stats.get(replica) or {}).get("status") or "")
        if replica not in ejected and (status.startswith("DOWN") or status.startswith("MAINT")):
            ejected.add(replica)
            _event(
                lab,
                {"t": now, "event": "lb_ejected", "replica": replica, "fault_id": record.get("id")},
            )
        elif (
            replica in moved and replica in ejected and replica not in back_in_lb and status == "UP"
        ):
            back_in_lb.add(replica)
            entry = netns.read_placement(lab.state_dir).get(replica) or {}
            _event(
                lab,
                {
                    "t": now,
                    "event": "lb_up",
                    "replica": replica,
                    "node": entry.get("node"),
                    "fault_id": record.get("id"),
                },
            )


def run_controller(state_dir: Path, fault_id: str, tick_s: float = 0.05) -> int:
    """Drive one node loss to its end (see the module docstring). Returns an exit code."""
    lab = Lab.attach(state_dir)
    started = time.time()
    rescheduled = restored = False
    moved: dict[str, float] = {}  # replica -> rescheduled at
    reported: set[str] = set()
    ejected: set[str] = set()  # HAProxy marked it DOWN after the loss
    back_in_lb: set[str] = set()  # HAProxy marked it UP again after the move
    while True:
        record = _record(lab.state_dir, fault_id)
        if record is None:
            print(f"controller {fault_id}: fault record gone (rolled back); exiting", flush=True)
            return 0
        try:  # the ledger is data: act on this lab's node and replica names only
            record = registry.validate(lab, record)
        except registry.LedgerRefused as exc:
            print(f"controller {fault_id}: {exc}; exiting", file=sys.stderr, flush=True)
            return 1
        if not lab._supervisord_alive():
            print(f"controller {fault_id}: lab not running; exiting", flush=True)
            return 0
        t0 = float(record.get("fault_at") or started)
        now = time.time()
        down_s = float(record["down_s"])
        resched_s = float(record["reschedule_after_s"])
        try:
            if not restored and now >= t0 + down_s:
                for note in restore(lab, record, by="dead-man timer"):
                    print(f"controller {fault_id}: {note}", flush=True)
                restored = True
            if not rescheduled and not restored and now >= t0 + resched_s:
                for ev in reschedule(lab, record):
                    moved[str(ev["replica"])] = float(ev["t"])
                    print(f"controller {fault_id}: moved {ev['replica']} to {ev['to_node']}")
                rescheduled = True
            _watch_lb(lab, record, moved, ejected, back_in_lb)
            for replica, since in moved.items():
                if replica in reported:
                    continue
                served = lab.served(replica, after=since)
                if served is not None:
                    entry = netns.read_placement(lab.state_dir).get(replica) or {}
                    _event(
                        lab,
                        {
                            "t": served,
                            "event": "serving",
                            "replica": replica,
                            "node": entry.get("node"),
                            "fault_id": fault_id,
                        },
                    )
                    reported.add(replica)
                elif now > since + SERVING_WAIT_S:
                    reported.add(replica)  # give up waiting; the figures will say "never"
        except LabError as exc:
            print(f"controller {fault_id}: {exc}", file=sys.stderr, flush=True)
        waiting = [r for r in moved if r not in reported]
        if restored and not waiting:
            return 0
        if now > t0 + max(down_s, resched_s) + CONTROLLER_GRACE_S:
            print(f"controller {fault_id}: giving up after the grace period", flush=True)
            return 1
        time.sleep(tick_s)


def main(argv: list[str] | None = None) -> int:
    """``python -m chaoslib_infer.lab.nodes --state-dir D --fault-id ID`` (the node controller)."""
    parser = argparse.ArgumentParser(prog="python -m chaoslib_infer.lab.nodes")
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--fault-id", required=True)
    args = parser.parse_args(argv)
    try:
        return run_controller(args.state_dir.resolve(), args.fault_id)
    except LabError as exc:
        print(f"controller {args.fault_id}: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
