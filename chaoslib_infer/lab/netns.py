"""Network namespaces for lab *nodes*, and the exec wrapper that runs a replica inside one.

A lab brought up with ``nodes=N`` (see :mod:`chaoslib_infer.lab.nodes`) gives every node its own
network namespace ``chaosinfer-<lab_id>-<node>`` joined to the root namespace by one veth pair:

- root side ``ci<lab_id>r<i>`` holds ``10.213.X.(4i+1)/30``, node side ``ci<lab_id>n<i>`` (moved
  into the namespace) holds ``10.213.X.(4i+2)/30``; loopback is up inside;
- ``X`` is chosen per lab so that no address or route of this machine overlaps ``10.213.X.0/24``;
  an ``unreachable 10.213.X.0/24`` guard route in the root namespace makes sure that traffic to an
  address of the range that has no node (or a node whose veth is gone) never leaves the machine;
- there is no default route inside a namespace: a node reaches only its own /30 peer.

Cutting a node's network sets the node-side veth down: the kernel drops every frame on the link
(the root side loses carrier, its route stays, marked ``linkdown``), so the load balancer sees a
silent host: connects time out or fail with "no route to host" once ARP gives up, and in-flight
streams stall, as with a compute node that lost power. ``iptables``/``nft`` are not needed.

Which node a replica runs on (its *placement*) lives in ``state_dir/placement.json``
(``{"replicas": {name: {"node", "ns", "host"}}}``), so a restart by supervisord lands where the
lab last put the replica. supervisord runs each replica as::

    python -m chaoslib_infer.lab.netns --state-dir D --replica r0 --cgroup C -- engine ... --host H ...

which joins the memory cgroup ``C``, enters the replica's namespace (``setns(2)``), replaces the
value of the engine's ``--host`` with the node address and ``exec``s the engine (so the pid that
supervisord watches is the engine's, as with :mod:`chaoslib_infer.lab.cgexec`).

Errors are :class:`NetnsError` with a one-line message (``ip`` missing, namespace creation not
permitted, ...).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from chaoslib_infer.errors import InferChaosError
from chaoslib_infer.lab.cgexec import command_after_dashes, exec_command, join_cgroup
from chaoslib_infer.safety.redact import child_env

__all__ = [
    "NS_PREFIX",
    "PLACEMENT_FILE",
    "SUBNET_BASE",
    "NetnsError",
    "add_guard_route",
    "create_node",
    "delete_guard_route",
    "delete_node",
    "enter_netns",
    "find_ip",
    "link_is_up",
    "list_namespaces",
    "main",
    "node_addresses",
    "pick_subnet",
    "read_placement",
    "rehost_argv",
    "replica_host",
    "run_ip",
    "set_link",
    "update_placement",
    "veth_names",
]

NS_PREFIX = "chaosinfer"
SUBNET_BASE = "10.213"  # 10.213.X.0/24 per lab, one /30 per node
PLACEMENT_FILE = "placement.json"
NETNS_RUN_DIRS = ("/run/netns", "/var/run/netns")
CLONE_NEWNET = 0x40000000
IP_CANDIDATES = ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip")


class NetnsError(InferChaosError):
    """Every expected namespace/veth failure; the message is one line."""


# --------------------------------------------------------------------------------------------
# iproute2
# --------------------------------------------------------------------------------------------
def find_ip() -> str:
    """Path of the ``ip`` binary (iproute2).

    Raises:
        NetnsError: not installed.
    """
    for cand in IP_CANDIDATES:
        if Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    found = shutil.which("ip")
    if found:
        return found
    raise NetnsError("`ip` (iproute2) not found: lab nodes need it (apt-get install iproute2)")


def run_ip(*args: str, ns: str | None = None, check: bool = True, timeout_s: float = 10.0) -> str:
    """Run ``ip [-n ns] args...`` and return its stdout.

    Raises:
        NetnsError: ``ip`` missing, or it failed (when ``check``); the message carries the first
            line of its stderr.
    """
    argv = [find_ip(), *(["-n", ns] if ns else []), *args]
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, env=child_env()
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(argv[1:])}: {exc}") from exc
    if check and proc.returncode != 0:
        first = (proc.stderr or proc.stdout).strip().splitlines()[:1]
        raise NetnsError(
            f"ip {' '.join(argv[1:])}: {first[0] if first else f'exit {proc.returncode}'}"
        )
    return proc.stdout


def ns_name(lab_id: str, node: str) -> str:
    """Namespace name of a node: ``chaosinfer-<lab_id>-<node>``."""
    return f"{NS_PREFIX}-{lab_id}-{node}"


def veth_names(lab_id: str, index: int) -> tuple[str, str]:
    """``(root side, node side)`` veth names of node ``index`` (at most 15 characters each)."""
    return f"ci{lab_id}r{index}", f"ci{lab_id}n{index}"


def node_addresses(subnet_x: int, index: int) -> tuple[str, str]:
    """``(root side, node side)`` IPv4 addresses of node ``index`` in ``10.213.X.(4i)/30``."""
    if not 0 <= index < 64:
        raise NetnsError(f"node index {index} out of range 0..63")
    base = 4 * index
    return f"{SUBNET_BASE}.{subnet_x}.{base + 1}", f"{SUBNET_BASE}.{subnet_x}.{base + 2}"


def _used_networks() -> list[ipaddress.IPv4Network]:
    nets: list[ipaddress.IPv4Network] = []
    text = run_ip("-o", "-4", "addr", "show") + "\n" + run_ip("-4", "route", "show", "table", "all")
    for token in text.split():
        if token[:1].isdigit() and token.count(".") == 3:
            with contextlib.suppress(ValueError):
                nets.append(ipaddress.IPv4Network(token, strict=False))
    return nets


def pick_subnet(seed: str) -> int:
    """Pick ``X`` such that ``10.213.X.0/24`` overlaps no address or route of this machine.

    Args:
        seed: hex string (the lab id) choosing where the search starts.

    Raises:
        NetnsError: every ``10.213.X.0/24`` is taken.
    """
    used = _used_networks()
    start = int(seed[:4] or "0", 16) % 256
    for k in range(256):
        x = (start + k) % 256
        cand = ipaddress.IPv4Network(f"{SUBNET_BASE}.{x}.0/24")
        if not any(cand.overlaps(n) for n in used if n.prefixlen >= 8):
            return x
    raise NetnsError(f"no free {SUBNET_BASE}.X.0/24 network for the lab nodes")


def add_guard_route(subnet_x: int) -> None:
    """``ip route add unreachable 10.213.X.0/24``: nothing of the range leaves the machine."""
    run_ip("route", "replace", "unreachable", f"{SUBNET_BASE}.{subnet_x}.0/24", "metric", "4242")


def delete_guard_route(subnet_x: int) -> None:
    """Remove the guard route (no error when it is not there)."""
    run_ip(
        "route",
        "del",
        "unreachable",
        f"{SUBNET_BASE}.{subnet_x}.0/24",
        "metric",
        "4242",
        check=False,
    )


def create_node(ns: str, veth_root: str, veth_node: str, root_ip: str, node_ip: str) -> None:
    """Create namespace ``ns`` and its veth pair (/30), bring links and loopback up.

    Raises:
        NetnsError: ``ip`` missing, not permitted (needs root / CAP_NET_ADMIN + CAP_SYS_ADMIN),
            or a name/address already in use.
    """
    try:
        run_ip("netns", "add", ns)
    except NetnsError as exc:
        raise NetnsError(
            f"cannot create network namespace {ns} ({exc}); lab nodes need root "
            "(CAP_SYS_ADMIN and CAP_NET_ADMIN)"
        ) from exc
    run_ip("link", "add", veth_root, "type", "veth", "peer", "name", veth_node)
    run_ip("link", "set", "dev", veth_node, "netns", ns)
    run_ip("addr", "add", f"{root_ip}/30", "dev", veth_root)
    run_ip("link", "set", "dev", veth_root, "up")
    run_ip("addr", "add", f"{node_ip}/30", "dev", veth_node, ns=ns)
    run_ip("link", "set", "dev", "lo", "up", ns=ns)
    run_ip("link", "set", "dev", veth_node, "up", ns=ns)


def delete_node(ns: str, veth_root: str) -> list[str]:
    """Delete a node's namespace and veth pair; idempotent. Returns what is still left (errors)."""
    left: list[str] = []
    if ns in list_namespaces(ns):
        try:
            run_ip("netns", "del", ns)
        except NetnsError as exc:
            left.append(str(exc))
    if _link_exists(veth_root):
        # Deleting the namespace deletes the pair unless a process still holds the namespace.
        run_ip("link", "del", "dev", veth_root, check=False)
        if _link_exists(veth_root):
            left.append(f"veth {veth_root} still present")
    return left


def _link_exists(dev: str, ns: str | None = None) -> bool:
    return bool(run_ip("-o", "link", "show", "dev", dev, ns=ns, check=False).strip())


def list_namespaces(prefix: str = NS_PREFIX) -> list[str]:
    """Names of the network namespaces (``ip netns list``) starting with ``prefix``."""
    out = run_ip("netns", "list", check=False)
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(prefix)]


def set_link(ns: str, dev: str, up: bool) -> None:
    """Set ``dev`` inside ``ns`` up or down (cuts or restores the node's network)."""
    run_ip("link", "set", "dev", dev, "up" if up else "down", ns=ns)


def link_is_up(ns: str, dev: str) -> bool | None:
    """Whether ``dev`` in ``ns`` is administratively up; None when the namespace or link is gone."""
    out = run_ip("-o", "link", "show", "dev", dev, ns=ns, check=False)
    if "<" not in out:
        return None
    flags = out.split("<", 1)[1].split(">", 1)[0].split(",")
    return "UP" in flags


# --------------------------------------------------------------------------------------------
# Placement (which node each replica runs on)
# --------------------------------------------------------------------------------------------
def read_placement(state_dir: Path) -> dict[str, dict[str, Any]]:
    """``{replica: {"node", "ns", "host"}}`` from ``state_dir/placement.json`` ({} without nodes)."""
    try:
        data = json.loads((Path(state_dir) / PLACEMENT_FILE).read_text())
    except (OSError, ValueError):
        return {}
    reps = data.get("replicas") if isinstance(data, dict) else None
    return dict(reps) if isinstance(reps, dict) else {}


@contextlib.contextmanager
def update_placement(state_dir: Path) -> Iterator[dict[str, dict[str, Any]]]:
    """Locked read-modify-write of the placement (atomic replace on exit)."""
    path = Path(state_dir) / PLACEMENT_FILE
    with open(path.with_name(PLACEMENT_FILE + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        reps = read_placement(state_dir)
        yield reps
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"replicas": reps}, indent=2) + "\n")
        os.replace(tmp, path)


def replica_host(state_dir: Path, replica: str) -> str:
    """Address a replica listens on: its node's IP, or ``127.0.0.1`` in a lab without nodes."""
    entry = read_placement(state_dir).get(replica) or {}
    return str(entry.get("host") or "127.0.0.1")


# --------------------------------------------------------------------------------------------
# Exec wrapper
# --------------------------------------------------------------------------------------------
def enter_netns(ns: str) -> None:
    """Move the calling (single-threaded) process into namespace ``ns`` (``setns(2)``).

    Raises:
        NetnsError: the namespace does not exist or the call is not permitted.
    """
    path = next((f"{d}/{ns}" for d in NETNS_RUN_DIRS if os.path.exists(f"{d}/{ns}")), None)
    if path is None:
        raise NetnsError(f"network namespace {ns} does not exist")
    setns: Callable[[int, int], int] = ctypes.CDLL(None, use_errno=True).setns
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsError(f"setns({ns}): {os.strerror(err)}")
    finally:
        os.close(fd)


def rehost_argv(argv: list[str], host: str) -> list[str]:
    """Replace the value of ``--host`` (``--host H`` or ``--host=H``) in ``argv`` with ``host``.

    Raises:
        NetnsError: ``argv`` has no ``--host`` (the engine cannot be told where to listen).
    """
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--host" and i + 1 < len(out):
            out[i + 1] = host
            return out
        if arg.startswith("--host="):
            out[i] = f"--host={host}"
            return out
    raise NetnsError("engine command has no --host argument; lab nodes need one")


def main(argv: list[str] | None = None) -> int:
    """``python -m chaoslib_infer.lab.netns --state-dir D --replica R [--cgroup C] -- cmd...``.

    Joins cgroup ``C``, enters the namespace of the node ``R`` is placed on, points the command's
    ``--host`` at the node address and execs it. Exit 125 (cgroup), 126 (namespace), 127 (exec).
    """
    parser = argparse.ArgumentParser(prog="python -m chaoslib_infer.lab.netns")
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--replica", required=True)
    parser.add_argument("--cgroup", default=None, help="cgroup directory to join first")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command [args...]")
    args = parser.parse_args(argv)
    cmd = command_after_dashes(parser, args.cmd)
    if args.cgroup:
        failed = join_cgroup(args.cgroup, "netns")
        if failed is not None:
            return failed
    entry = read_placement(args.state_dir).get(args.replica)
    if entry:
        try:
            enter_netns(str(entry["ns"]))
            cmd = rehost_argv(cmd, str(entry["host"]))
        except NetnsError as exc:
            print(f"netns: {args.replica}: {exc}", file=sys.stderr, flush=True)
            return 126
    return exec_command(cmd, "netns")


if __name__ == "__main__":
    sys.exit(main())
