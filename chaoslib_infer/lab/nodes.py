"""Lab *nodes*: replicas grouped into network namespaces, and the loss of a whole node.

``Lab.up(..., nodes=N)`` (``chaos-infer lab up --nodes N``) spreads the replicas round-robin over
``N`` nodes ``n0..n{N-1}`` and, with ``spare_node=True`` (the default when ``N >= 1``), adds one empty
**spare node** ``nN``. Each node is a network namespace with a veth pair to the root namespace
(:mod:`chaoslib_infer.lab.netns`); its replicas listen on the node address, where HAProxy (root
namespace), the lab's readiness checks and the recorder's health poller reach them.

Losing a node (:func:`lose_node`, ``Lab.lose_node``), the way a compute node drops:

1. the fault is recorded with ``lab.add_fault`` (kind ``node-loss``, module this one) and the
   node controller is started (see below), both *before* anything is touched;
2. at the fault time ``fault_at`` (``node_down`` event) its replicas are frozen (SIGSTOP) and
   then its network is cut (its veth set down inside the namespace): the node stops at once, so
   no generation can finish after ``fault_at`` into a link that no longer carries its answer
   (such a finish would read as a completed generation the client re-sent);
3. its replicas are told to stop through supervisord (so that supervisord does not restart
   them: autorestart only applies to unexpected exits) and SIGKILLed at once: they die without
   a chance to answer or close a connection, and their RSTs would not cross the cut link;
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
reschedule_after_s) + 30``) for the lab's watchdog (:mod:`chaoslib_infer.lab.deadman`), which
then runs :func:`undo_fault`.

The rollback (:func:`undo_fault`, through ``lab.clear_faults()`` / ``lab.remove_fault``) kills the
controller, restores the node's network, points HAProxy at wherever each lost replica is placed,
enables it and starts every lost replica that is not running: the lab is whole again.

All times are unix seconds; ground-truth events go to ``state_dir/events.jsonl``.

Layout: this module is the node-loss fault's home (fault records name it; its
:func:`undo_fault` / :func:`fault_active` are those of :mod:`chaoslib_infer.lab.nodeloss`) and the
node controller; the bring-up and teardown of nodes live in :mod:`chaoslib_infer.lab.topology`
and the injection, rescheduling and rollback in :mod:`chaoslib_infer.lab.nodeloss`, both
re-exported here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.lab import netns, registry
from chaoslib_infer.lab.fleet import Lab
from chaoslib_infer.lab.nodeloss import (
    FAULT_KIND,
    MODULE,
    fault_active,
    lose_node,
    record_event,
    reschedule,
    restore,
    undo_fault,
)
from chaoslib_infer.lab.statedir import FAULTS_FILE, HAPROXY_SOCK, LabError
from chaoslib_infer.lab.topology import (
    MAX_NODES,
    haproxy_config,
    node_status,
    plan_nodes,
    program_command,
    setup_nodes,
    teardown_nodes,
    validate_nodes,
)

__all__ = [
    "FAULT_KIND",
    "MAX_NODES",
    "MODULE",
    "fault_active",
    "haproxy_config",
    "lose_node",
    "main",
    "node_status",
    "plan_nodes",
    "program_command",
    "reschedule",
    "restore",
    "run_controller",
    "setup_nodes",
    "teardown_nodes",
    "undo_fault",
    "validate_nodes",
]

CONTROLLER_GRACE_S = 120.0
SERVING_WAIT_S = 60.0


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
            record_event(
                lab,
                {"t": now, "event": "lb_ejected", "replica": replica, "fault_id": record.get("id")},
            )
        elif (
            replica in moved and replica in ejected and replica not in back_in_lb and status == "UP"
        ):
            back_in_lb.add(replica)
            entry = netns.read_placement(lab.state_dir).get(replica) or {}
            record_event(
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
        if not lab.supervisord_alive():
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
                    record_event(
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
