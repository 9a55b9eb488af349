"""Lab nodes' bring-up and teardown: replicas grouped into network namespaces.

``Lab.up(..., nodes=N)`` spreads the replicas round-robin over ``N`` nodes and an optional spare
node (see :mod:`chaoslib_infer.lab.nodes` for the whole story, and the loss of a node). This
module holds what the lab's lifecycle needs: checking the options, planning the layout into
``lab.json``, creating and deleting the namespaces, the replicas' supervisord command and their
HAProxy addresses, and the nodes' status. It imports nothing of the fleet at run time.
"""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaoslib_infer.lab import netns
from chaoslib_infer.lab.netns import NetnsError
from chaoslib_infer.lab.statedir import LabError

if TYPE_CHECKING:
    from chaoslib_infer.lab.fleet import Lab

__all__ = [
    "MAX_NODES",
    "all_replicas",
    "haproxy_config",
    "node_status",
    "node_up",
    "plan_nodes",
    "program_command",
    "setup_nodes",
    "teardown_nodes",
    "validate_nodes",
]

MAX_NODES = 16


# --------------------------------------------------------------------------------------------
# Bring-up and teardown (called by the lab's lifecycle: Lab.up / Lab.down)
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
    """Point the ``server NAME ADDR:PORT`` lines of a rendered haproxy.cfg at ``{name: (host, port)}``:
    the one of backend ``engines``, and the one of the replica's lane when the lab has lanes
    (``gateway: litellm``, :func:`chaoslib_infer.lab.gateways.litellm.lanes_config`).

    Raises:
        LabError: a replica has no server line, or more than one in a backend.
    """
    for name, (host, port) in servers.items():
        pattern = re.compile(rf"^(\s*server\s+{re.escape(name)}\s+)\S+(\s)", re.M)
        address = f"{host}:{port}"
        lane = f"backend lane_{name}\n" in text
        text, count = pattern.subn(lambda m: f"{m[1]}{address}{m[2]}", text)  # noqa: B023
        if count != 1 + lane:
            raise LabError(f"haproxy.cfg has {count} server lines for {name}, expected {1 + lane}")
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


def node_up(node: dict[str, Any]) -> bool | None:
    """Whether a node's link is up (its veth inside its namespace); None: namespace gone."""
    try:
        return netns.link_is_up(node["ns"], node["veth_node"])
    except NetnsError:
        return None


def all_replicas(lab: Lab) -> list[str]:
    """Every configured replica, standby ones (autoscaler) included."""
    return [str(r["name"]) for r in lab.meta["replicas"]]


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
                "up": node_up(node),
                "replicas": [
                    r
                    for r in all_replicas(lab)
                    if (placement.get(r) or {}).get("node") == node["name"]
                ],
            }
        )
    return out
