"""The loss of a whole lab node: inject (:func:`lose_node`), reschedule, restore, undo.

The story, the dead-man and the rollback are told in :mod:`chaoslib_infer.lab.nodes`, which
re-exports this module's public names and runs the node controller (``python -m
chaoslib_infer.lab.nodes``); fault records name that module. This module acts on a running
:class:`~chaoslib_infer.lab.fleet.Lab` through its public surface only and imports nothing of
the fleet at run time (the fleet imports it for ``Lab.lose_node``).

All times are unix seconds; ground-truth events go to ``state_dir/events.jsonl``.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import sys
import time
import xmlrpc.client
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.lab import netns, procfs
from chaoslib_infer.lab.netns import NetnsError
from chaoslib_infer.lab.processes import alive, spawn_in_cgroup, wait_dead
from chaoslib_infer.lab.recorder import EVENTS_FILE, append_event
from chaoslib_infer.lab.statedir import HAPROXY_SOCK, LabError
from chaoslib_infer.lab.supervisor_rpc import rpc, start_process
from chaoslib_infer.lab.topology import all_replicas, haproxy_config, node_up

if TYPE_CHECKING:
    from chaoslib_infer.lab.fleet import Lab

__all__ = [
    "FAULT_KIND",
    "MODULE",
    "record_event",
    "fault_active",
    "lose_node",
    "reschedule",
    "restore",
    "undo_fault",
]

FAULT_KIND = "node-loss"
#: ``module`` of a node-loss fault record, and the node controller's ``python -m`` module
MODULE = "chaoslib_infer.lab.nodes"
_NOT_RUNNING = 70


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


def _placed_on(lab: Lab, node: str) -> list[str]:
    placement = netns.read_placement(lab.state_dir)
    return [r for r in all_replicas(lab) if (placement.get(r) or {}).get("node") == node]


def record_event(lab: Lab, record: dict[str, Any]) -> None:
    """Append one ground-truth record to the lab's ``events.jsonl``."""
    append_event(lab.state_dir / EVENTS_FILE, record)


def _states(lab: Lab) -> dict[str, str]:
    try:
        infos = rpc(lab.state_dir, 2.0).supervisor.getAllProcessInfo()
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
        return start_process(lab.state_dir, replica)
    except xmlrpc.client.Fault as exc:
        raise LabError(f"supervisord could not start {replica}: {exc.faultString}") from exc
    except (OSError, http.client.HTTPException) as exc:
        raise LabError(f"supervisord not answering: {exc}") from exc


def _free_spare(lab: Lab, exclude: str) -> dict[str, Any] | None:
    """An up node holding no replica (designated spares first), other than ``exclude``."""
    placement = netns.read_placement(lab.state_dir)
    used = {(e or {}).get("node") for e in placement.values()}
    cands = [n for n in _nodes(lab) if n["name"] != exclude and n["name"] not in used]
    cands.sort(key=lambda n: (not n.get("spare"), int(n["index"])))
    for node in cands:
        if node_up(node):
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
    if node_up(_node(lab, lost_node)):
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
        record_event(
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
        record_event(lab, event)
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
    if node_up(node) is False:
        try:
            netns.set_link(node["ns"], node["veth_node"], True)
        except NetnsError as exc:
            raise LabError(str(exc)) from exc
        record_event(
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
    if not lab.supervisord_alive():
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
        if _placed_on(lab, cand["name"]) and node_up(cand):
            return str(cand["name"])
    raise LabError("no up node holds a replica")


def _update_record(lab: Lab, fault_id: str, **fields: Any) -> None:
    with lab.edit_faults() as faults:
        for f in faults:
            if f.get("id") == fault_id:
                f.update(fields)


def _spawn_controller(lab: Lab, fault_id: str) -> int:
    sd = lab.state_dir
    (sd / "logs").mkdir(exist_ok=True)
    proc = spawn_in_cgroup(
        str(lab.meta["ctl_cgroup"]),
        [sys.executable, "-m", MODULE, "--state-dir", str(sd), "--fault-id", fault_id],
        sd,
        sd / "logs" / "node-controller.log",
    )
    return int(proc.pid)


def _thaw(pids: Iterable[int]) -> None:
    """SIGCONT the process groups of ``pids`` (a failed injection froze and did not kill them)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGCONT)


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
        ``{"fault_id", "node", "ns", "fault_at" (unix s: its replicas frozen, then its network
        cut), "killed_at", "replicas" (lost), "killed_pids", "down_s", "reschedule_after_s",
        "controller_pid", "spare" (the spare node free at injection time, or None),
        "state_dir"}``.

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
    if not lab.supervisord_alive():
        raise LabError(f"the lab in {lab.state_dir} is not running")
    name = _pick_node(lab, node)
    info = _node(lab, name)
    if node_up(info) is not True:
        raise LabError(f"node {name} is already down")
    infos = lab.process_infos()
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
    frozen = False
    try:
        controller_pid = _spawn_controller(lab, fault_id)
        _update_record(lab, fault_id, controller_pid=controller_pid)
        # the node stops all at once: its replicas are frozen first (nothing they do after
        # fault_at, a generation finished into a cut link included, can happen), then its
        # network is cut; what they wrote before fault_at crossed the link while it was up
        fault_at = time.time()
        frozen = True
        for pid in pids.values():  # freeze all first: nobody runs a signal handler
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGSTOP)
        netns.set_link(info["ns"], info["veth_node"], False)
        _update_record(lab, fault_id, fault_at=fault_at)
        record_event(
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
        proxy = rpc(lab.state_dir, 5.0)
        for replica, pid in pids.items():
            with contextlib.suppress(xmlrpc.client.Fault):  # NOT_RUNNING: already gone
                proxy.supervisor.stopProcess(replica, False)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        frozen = False
        for replica, pid in pids.items():
            if not wait_dead(pid, 5.0):
                raise LabError(f"replica {replica} pid {pid} survived SIGKILL")
        killed_at = time.time()
        deadline = time.monotonic() + 5.0
        while any(_states(lab).get(r) not in ("STOPPED", "EXITED") for r in lost):
            if time.monotonic() > deadline:
                raise LabError(f"supervisord did not mark {', '.join(lost)} stopped")
            time.sleep(0.02)
        _update_record(lab, fault_id, killed_at=killed_at)
    except (NetnsError, OSError, xmlrpc.client.Error, http.client.HTTPException) as exc:
        _thaw(pids.values() if frozen else ())
        with contextlib.suppress(Exception):
            lab.remove_fault(fault_id)
        raise LabError(f"node loss of {name} failed and was undone: {exc}") from exc
    except BaseException:
        _thaw(pids.values() if frozen else ())
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
    return alive(pid) and MODULE in cmd and fault_id in cmd


def _kill_controller(record: dict[str, Any]) -> bool:
    pid = int(record.get("controller_pid") or 0)
    if pid and _is_controller(pid, str(record.get("id"))):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_dead(pid, 5.0)
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
    if lost and lab.supervisord_alive():
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
    if node_up(node) is False:
        return True
    if lab.supervisord_alive():
        states = _states(lab)
        return any(states.get(r) != "RUNNING" for r in record.get("replicas") or [])
    return False
