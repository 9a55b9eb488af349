"""The fault ledger is data, never a plan: every undo is rebuilt from validated fields.

The lab's ``faults.json`` (:mod:`chaoslib_infer.lab.ledger`) lives in a folder a user or a CI
job writes into (``--out``), and the dead-man watchdog that replays it runs as root. So nothing
in a record is executed or imported as it stands: before any undo (the drill's rollback,
``chaos-infer rollback``, ``lab down``, the dead-man, ``lab status``), :func:`validate` rebuilds
the record from the fields it can check against the lab's own state (``lab.json``: replica
names, ports and cgroups, node names and network namespaces, the lab id), and only that rebuilt
record reaches the fault module:

- ``module`` must be a key of :data:`FAULT_MODULES` (an explicit registry: no other module is
  ever imported) and ``kind`` one of the kinds that module owns; a module-less record must be a
  memory hog (``oom-kill``);
- replica, node and network-namespace names must be this lab's; ports the replica's own;
  the freezer cgroup the replica's own or one named ``chaos-infer-<lab id>-freeze-<replica>``
  on a cgroup file system; ids, tokens and device names match the shapes the lab writes;
- a pid the undo would signal (a stopped replica, a memory hog) must be a live process of one of
  the lab's replica cgroups; one that is gone, or whose start time differs from the recorded one
  (a reused pid), is simply dropped (nothing to undo there); helper processes (timers, shims,
  controllers) are still recognised by their command line, as before;
- no argv is read from the record: ``tc`` command lines are rebuilt from the validated links
  (:mod:`chaoslib_infer.lab.netem`), the ``iptables`` rule from the validated namespace, port
  and name; argv lists still stored in a record must equal the rebuilt ones exactly.

A record that fails any check raises :class:`LedgerRefused` (one line: the record, the field,
why) and nothing of it runs. Policy (``docs/safety.md`` section 1): ``chaos-infer rollback`` and a
game day's start-up replay check the whole ledger first and undo nothing when one record is
refused (exit 2); ``Lab.clear_faults`` and the dead-man refuse that record only, keep it in the
ledger (never forgotten) and undo the others.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaoslib_infer.lab import freeze, procfs
from chaoslib_infer.lab import netem as nm
from chaoslib_infer.lab.cgroups import read_mounts
from chaoslib_infer.lab.hog import HOG_MODULE
from chaoslib_infer.lab.ledger_fields import (
    MODE_RE,
    TOKEN_RE,
    base_record,
    check_helper_pid,
    check_int,
    check_number,
    check_own_pid,
    check_replica,
    check_replica_list,
    check_text,
    lab_nodes,
    lab_pids,
    lab_replicas,
    refusal,
    shorten,
)
from chaoslib_infer.lab.ledger_fields import LedgerRefused as LedgerRefused
from chaoslib_infer.lab.processes import is_hog, kill
from chaoslib_infer.lab.statedir import LabError

if TYPE_CHECKING:
    from chaoslib_infer.lab.fleet import Lab

__all__ = [
    "FAULT_MODULES",
    "MODULE_LESS_KINDS",
    "LedgerRefused",
    "check_ledger",
    "fault_active",
    "fault_module",
    "undo",
    "validate",
]

#: Fault module -> the ledger kinds it owns (``undo_fault`` / ``fault_active``). The only modules
#: a ledger record may name; nothing else is ever imported from a ledger.
FAULT_MODULES: dict[str, frozenset[str]] = {
    "chaoslib_infer.lab.freeze": frozenset({"upstream-timeout"}),
    "chaoslib_infer.lab.nodes": frozenset({"node-loss"}),
    "chaoslib_infer.lab.scaling": frozenset({"quota-cut", "scale-out", "traffic-spike"}),
    "chaoslib_infer.lab.restarts": frozenset({"simultaneous-restarts"}),
    "chaoslib_infer.activities.network": frozenset({"network-jitter"}),
    "chaoslib_infer.activities.engine_faults": frozenset({"engine-fault"}),
    "chaoslib_infer.lab.testfault": frozenset({"test-marker", "test-sigstop"}),
}
#: Kinds recorded without a module (undone by the lab itself): the memory hog.
MODULE_LESS_KINDS = frozenset({"oom-kill"})


# --------------------------------------------------------------------------------------------
# one rebuilder per kind
# --------------------------------------------------------------------------------------------
def _freeze(lab: Lab, record: dict[str, Any], out: dict[str, Any]) -> None:

    replica = check_replica(record, lab)
    name = f"chaos-infer-{lab.meta.get('lab_id')}-freeze-{replica}"
    if record.get("name") != name:
        raise refusal(record, f"name {shorten(record.get('name'))} is not this lab's {name}")
    mode = record.get("mode")
    if mode not in freeze.MODES:
        raise refusal(record, f"mode {shorten(mode)} is not one of {', '.join(freeze.MODES)}")
    raw_pids = record.get("pids") or []
    starts = record.get("starttimes") or {}
    if not isinstance(raw_pids, list) or not isinstance(starts, dict):
        raise refusal(record, "pids must be a list and starttimes a mapping")
    owned = lab_pids(lab)
    pids: list[int] = []
    starttimes: dict[str, int] = {}
    for p in raw_pids:
        start = starts.get(str(p))
        if start is not None:
            start = check_int(record, "starttimes", start, 0, 1 << 62)
        mine = check_own_pid(record, lab, "pid", p, start, owned)
        if mine is not None:
            pids.append(mine)
            if start is not None:
                starttimes[str(mine)] = start
    rep = lab_replicas(lab)[replica]
    out.update(
        replica=replica,
        name=name,
        mode=mode,
        pids=pids,
        pid=pids[0] if pids else None,
        starttimes=starttimes,
        freezer=None,
        cgroup=None,
        moved=False,
        homes={},
        netns=None,
        port=None,
        deadman_pid=_deadman_pid(record, name),
    )
    if mode == "blackhole":
        netns = record.get("netns")
        spaces = {str(n.get("ns")) for n in lab_nodes(lab).values()}
        if netns not in spaces:
            raise refusal(record, f"netns {shorten(netns)} is not a network namespace of this lab")
        port = check_int(record, "port", record.get("port"), 1, 65535)
        if port != int(rep.get("port") or 0):
            raise refusal(record, f"port {port} is not {replica}'s port {rep.get('port')}")
        out.update(netns=netns, port=port)
        return
    if mode == "sigstop":
        return
    freezer = record.get("freezer")
    cgroup = record.get("cgroup")
    moved = record.get("moved")
    if freezer not in (1, 2) or not isinstance(cgroup, str) or not isinstance(moved, bool):
        raise refusal(record, "freezer must be 1 or 2, cgroup a path and moved a boolean")
    path = Path(cgroup)
    if not path.is_absolute() or ".." in path.parts or str(path) != cgroup.rstrip("/"):
        raise refusal(record, f"cgroup {shorten(cgroup)} is not a plain absolute path")
    if not moved:
        if freezer != 2 or cgroup != str(rep.get("cgroup")):
            raise refusal(record, f"cgroup {shorten(cgroup)} is not {replica}'s own cgroup")
        out.update(freezer=2, cgroup=cgroup)
        return
    if path.name != name:
        raise refusal(record, f"cgroup {shorten(cgroup)} is not named {name}")
    try:
        mounts = read_mounts(Path("/proc/self/mountinfo"))
    except OSError as exc:
        raise refusal(record, f"cannot read the cgroup mounts: {exc}") from None
    fstype = "cgroup" if freezer == 1 else "cgroup2"
    mount = next(
        (
            m
            for m in mounts
            if m.fstype == fstype
            and (freezer == 2 or "freezer" in m.options)
            and path.parent.is_relative_to(m.point)
        ),
        None,
    )
    if mount is None:
        raise refusal(record, f"cgroup {shorten(cgroup)} is not on a cgroup v{freezer} freezer")
    homes: dict[str, str] = {}
    raw_homes = record.get("homes") or {}
    if not isinstance(raw_homes, dict):
        raise refusal(record, "homes must be a mapping")
    for key, home in raw_homes.items():
        hp = Path(str(home))
        if (
            not isinstance(home, str)
            or not hp.is_absolute()
            or ".." in hp.parts
            or not hp.is_relative_to(mount.point)
            or hp.is_symlink()
        ):
            raise refusal(record, f"home cgroup {shorten(home)} is not on the same freezer")
        if str(key) in {str(p) for p in pids}:
            homes[str(key)] = home
    out.update(freezer=freezer, cgroup=cgroup, moved=True, homes=homes)


def _deadman_pid(record: dict[str, Any], name: str) -> int:
    """The freeze's dead-man timer: kept only when it is this fault's (its command line holds
    the fault's own name); a live timer of another fault is refused, a reused pid dropped."""
    pid = check_helper_pid(record, "deadman_pid")
    if not pid:
        return 0
    cmd = procfs.cmdline(pid)
    if "chaoslib_infer.lab.freeze" in cmd and " deadman " in cmd:
        if name not in cmd:
            raise refusal(record, f"deadman_pid {pid} is another fault's dead-man timer")
        return pid
    return 0


def _node_loss(lab: Lab, record: dict[str, Any], out: dict[str, Any]) -> None:
    node = record.get("node")
    if node not in lab_nodes(lab):
        raise refusal(record, f"node {shorten(node)} is not a node of this lab")
    out.update(
        node=node,
        replicas=check_replica_list(record, lab, "replicas"),
        controller_pid=check_helper_pid(record, "controller_pid"),
    )
    for key in ("fault_at", "killed_at", "down_s", "reschedule_after_s"):
        value = check_number(record, key)
        if value is not None:
            out[key] = value


def _scaling(lab: Lab, record: dict[str, Any], out: dict[str, Any]) -> None:
    kind = record["kind"]
    if kind == "quota-cut":
        quota = record.get("quota")
        out.update(
            replica=None,
            quota=check_int(record, "quota", quota, 1, 4096) if quota is not None else None,
            stopped=check_replica_list(record, lab, "stopped"),
            kept=check_replica_list(record, lab, "kept"),
        )
    elif kind == "scale-out":
        out["replica"] = check_replica(record, lab)
        value = check_number(record, "triggered_at")
        if value is not None:
            out["triggered_at"] = value
    else:  # traffic-spike: the undo works from the lab's own standby list
        out["replica"] = None
        for key in ("spike_start_at", "spike_end_at"):
            value = check_number(record, key)
            if value is not None:
                out[key] = value


def _restarts(lab: Lab, record: dict[str, Any], out: dict[str, Any]) -> None:
    replicas = check_replica_list(record, lab, "replicas")
    out.update(replicas=replicas, replica=replicas[0] if len(replicas) == 1 else None)
    method = record.get("method")
    if method is not None:
        out["method"] = check_text(record, "method")


def _network(lab: Lab, record: dict[str, Any], out: dict[str, Any]) -> None:

    replica = check_replica(record, lab)
    token = record.get("token")
    if not isinstance(token, str) or not TOKEN_RE.match(token):
        raise refusal(record, f"token {shorten(token)} is not a jitter token")
    mechanism = record.get("mechanism")
    out.update(replica=replica, token=token, mechanism=mechanism)
    drain = check_number(record, "drain_s")
    out["drain_s"] = min(max(drain if drain is not None else 2.0, 0.0), 60.0)
    if mechanism == "netem":
        allowed: set[tuple[str | None, str]] = set()
        for n in lab_nodes(lab).values():
            allowed.add((None, str(n.get("veth_root"))))
            allowed.add((str(n.get("ns")), str(n.get("veth_node"))))
        for rep in lab_replicas(lab).values():
            dev = rep.get("dev") or rep.get("link_dev")
            if dev:
                allowed.add((str(rep["netns"]) if rep.get("netns") else None, str(dev)))
        raw = record.get("links")
        if not isinstance(raw, list) or not raw:
            raise refusal(record, "links must be a non-empty list of [netns, device]")
        links: list[list[str | None]] = []
        for link in raw:
            if (
                not isinstance(link, list | tuple)
                or len(link) != 2
                or (link[0], link[1]) not in allowed
            ):
                raise refusal(record, f"link {shorten(link)} is not a link of this lab")
            links.append([link[0], link[1]])
        try:
            rebuilt = {
                "del_args": [nm.netem_del_args(str(d), ns) for ns, d in links],
                "show_args": [nm.netem_show_args(str(d), ns) for ns, d in links],
            }
        except ValueError as exc:
            raise refusal(record, str(exc)) from None
        for key, argv in rebuilt.items():
            stored = record.get(key)
            if stored is not None and stored != argv:
                raise refusal(record, f"{key} is not the lab's own tc command for its links")
        out.update(links=links, watchdog_pid=check_helper_pid(record, "watchdog_pid"))
        return
    if mechanism != "shim":
        raise refusal(record, f"mechanism {shorten(mechanism)} is not netem or shim")
    detour = f"{replica}-jitter"
    if record.get("detour") not in (None, detour):
        raise refusal(record, f"detour {shorten(record.get('detour'))} is not {detour}")
    out.update(detour=detour, shim_pid=check_helper_pid(record, "shim_pid"))
    addr = check_text(record, "orig_addr")
    if addr is not None:
        out["orig_addr"] = addr
    if record.get("orig_port") is not None:
        out["orig_port"] = check_int(record, "orig_port", record["orig_port"], 1, 65535)


def _engine_fault(lab: Lab, record: dict[str, Any], out: dict[str, Any]) -> None:
    replica = check_replica(record, lab)
    rep = lab_replicas(lab)[replica]
    port = check_int(record, "port", record.get("port"), 1, 65535)
    if port != int(rep.get("port") or 0):
        raise refusal(record, f"port {port} is not {replica}'s port {rep.get('port')}")
    mode = record.get("mode")
    if mode is not None and (not isinstance(mode, str) or not MODE_RE.match(mode)):
        raise refusal(record, f"mode {shorten(mode)} is not an engine fault mode")
    try:
        host = lab.replica_host(replica)  # where the replica listens now, from the lab itself
    except (LabError, OSError, ValueError, KeyError):
        host = "127.0.0.1"
    out.update(replica=replica, port=port, mode=mode, host=host)


def _testfault(lab: Lab, record: dict[str, Any], out: dict[str, Any]) -> None:
    if record["kind"] == "test-marker":
        raw = record.get("path")
        path = Path(str(raw))
        if not isinstance(raw, str) or not path.is_absolute() or ".." in path.parts:
            raise refusal(record, f"path {shorten(raw)} is not an absolute path")
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise refusal(record, f"path {raw} is not a regular file")
        if path.exists():
            try:
                content = path.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError):
                content = None
            if not out.get("id") or content != out["id"]:
                raise refusal(record, f"{raw} is not this fault's marker (its content differs)")
        out["path"] = raw
        return
    replica = check_replica(record, lab)
    start = record.get("start_time")
    if start is not None and (not isinstance(start, str) or not start.isdigit()):
        raise refusal(record, "start_time must be a number of clock ticks")
    pid = check_own_pid(record, lab, "pid", record.get("pid"), start, lab_pids(lab))
    out.update(replica=replica, pid=pid or 0, start_time=start)


def _hog(lab: Lab, record: dict[str, Any], out: dict[str, Any]) -> None:

    replica = check_replica(record, lab)
    owned = lab_pids(lab)
    pid = record.get("pid")
    if isinstance(pid, int) and not isinstance(pid, bool) and pid not in owned:
        # a hog that has not joined its replica's cgroup yet (its first step): its command line
        # names this lab's cgroup
        cg = str(lab_replicas(lab)[replica].get("cgroup"))
        if f"{HOG_MODULE} --cgroup {cg} " in procfs.cmdline(pid) + " ":
            owned = owned | {pid}
    mine = check_own_pid(record, lab, "pid", pid, None, owned)
    out.update(replica=replica, pid=mine or 0, hog_pid=mine or 0)


_REBUILD = {
    "chaoslib_infer.lab.freeze": _freeze,
    "chaoslib_infer.lab.nodes": _node_loss,
    "chaoslib_infer.lab.scaling": _scaling,
    "chaoslib_infer.lab.restarts": _restarts,
    "chaoslib_infer.activities.network": _network,
    "chaoslib_infer.activities.engine_faults": _engine_fault,
    "chaoslib_infer.lab.testfault": _testfault,
}


# --------------------------------------------------------------------------------------------
# public surface
# --------------------------------------------------------------------------------------------
def fault_module(name: Any) -> Any:
    """Import the fault module ``name``, a key of :data:`FAULT_MODULES`; nothing else.

    Raises:
        LedgerRefused: ``name`` is not in the registry (it is never imported).
    """
    if not isinstance(name, str) or name not in FAULT_MODULES:
        raise LedgerRefused(
            f"refusing fault module {shorten(name)}: not in the registry of fault modules "
            f"({', '.join(sorted(FAULT_MODULES))})"
        )
    return importlib.import_module(name)


def validate(lab: Lab, record: Any) -> dict[str, Any]:
    """Rebuild ``record`` from the fields that check out against ``lab`` (see the module text).

    Args:
        lab: the lab whose ledger holds the record (its ``meta``: replicas, nodes, lab id).
        record: one entry of ``faults.json``.

    Returns:
        A new record holding only validated fields (the one the fault module's ``undo_fault`` and
        ``fault_active`` get); pids that are gone or reused are dropped.

    Raises:
        LedgerRefused: one line naming the record and the field that does not belong to this lab
            (unknown module or kind, foreign name, pid, namespace, path, mismatched argv).
    """
    if not isinstance(record, dict):
        raise LedgerRefused(f"ledger record {shorten(record)} refused: not a JSON object")
    kind = record.get("kind")
    if not isinstance(kind, str) or not kind:
        raise refusal(record, "no kind")
    module = record.get("module")
    if module is None:
        if kind not in MODULE_LESS_KINDS:
            raise refusal(record, f"kind {shorten(kind)} needs a fault module")
        out = base_record(record, None)
        _hog(lab, record, out)
        return out
    if not isinstance(module, str) or module not in FAULT_MODULES:
        raise refusal(record, f"module {shorten(module)} is not in the registry of fault modules")
    if kind not in FAULT_MODULES[module]:
        raise refusal(record, f"kind {shorten(kind)} is not a kind of {module}")
    out = base_record(record, module)
    _REBUILD[module](lab, record, out)
    return out


def undo(lab: Lab, record: dict[str, Any]) -> str | None:
    """Validate ``record``, then undo it through its registered module (a module-less memory
    hog record: kill the hog, when it is still a hog of this lab).

    Returns:
        The module's description of what it undid, or None when nothing was left.

    Raises:
        LedgerRefused: the record does not validate (nothing ran).
        Exception: whatever the module's ``undo_fault`` raises.
    """
    clean = validate(lab, record)
    if "module" in clean:
        note = fault_module(clean["module"]).undo_fault(lab, clean)
        return None if note is None else str(note)
    pid = int(clean.get("pid") or 0)
    if is_hog(pid):
        kill(pid)
        return f"{clean['kind']} on {clean.get('replica')}: killed memory hog pid {pid}"
    return None


def fault_active(lab: Lab, record: dict[str, Any]) -> bool:
    """Whether the validated ``record`` is still in effect (its module's ``fault_active``).

    Raises:
        LedgerRefused: the record does not validate (nothing ran; report it as active).
    """
    clean = validate(lab, record)
    if "module" in clean:
        return bool(fault_module(clean["module"]).fault_active(lab, clean))
    return is_hog(int(clean.get("pid") or 0))


def check_ledger(lab: Lab, records: list[Any]) -> list[str]:
    """Validate every record of a ledger; return one refusal line per record that fails ([] when
    every record belongs to this lab). Nothing is undone."""
    refused = []
    for record in records:
        try:
            validate(lab, record)
        except LedgerRefused as exc:
            refused.append(str(exc))
    return refused
