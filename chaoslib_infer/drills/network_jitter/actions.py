"""Network jitter on one replica's link (drill 3 of the list: "does the client retry, and do retries
cause duplicate generation?").

Two mechanisms, chosen by ``mechanism="auto"``:

* ``netem``: a ``tc netem`` root qdisc (delay, jitter, loss) on the replica's link device, inside
  its network namespace, when the kernel has netem (:func:`chaoslib_infer.lab.netem.netem_available`)
  and the lab tells which device carries the replica's traffic: the veth pair of the
  network-namespace node the replica runs on (``lab.json`` ``nodes``, ``placement.json``), a
  replica entry's ``dev``/``netns`` keys, or the action's ``dev``/``netns`` arguments.
* ``shim``: everywhere else (the loopback lab, kernels without netem): a jitter proxy
  (:mod:`chaoslib_infer.lab.shim`) between HAProxy and the replica. HAProxy's runtime API routes
  the replica's new requests through it (a run-time "detour" server ``rN-jitter`` at the shim's
  address, the replica's own server in maintenance so none of its keep-alive connections is
  reused) and back on undo (server ready, detour drained and deleted).

Every fault is recorded with ``lab.add_fault`` *before* injection (``kind: network-jitter``,
:data:`FAULT_MODULE` as ``module``; :func:`undo_fault` and :func:`fault_active` are its undo contract), appended
to the drill's fault log, and marked in the lab's ``events.jsonl`` (``{"event": "network-jitter",
"phase": "applied"|"removed", "token", "by"}``) at the moment new requests start and stop
crossing the jittery link: the ground truth of the fault window.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import time
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer.lab import netem as nm
from chaoslib_infer.lab.activity import attach_lab, last_fault, log_fault, pick_replica
from chaoslib_infer.lab.fleet import Lab, LabError
from chaoslib_infer.lab.recorder import EVENTS_FILE, append_event
from chaoslib_infer.lab.shim import (
    ADMIN_FMAINT,
    DRAIN_S,
    SHIM_MODULE,
    default_server_options,
    delete_detour,
    divert_to_detour,
    haproxy_servers_state,
    restore_from_detour,
)
from chaoslib_infer.safety.redact import child_env

from .plumbing import (
    BACKEND,
    CHILDREN,
    HAPROXY_SOCK,
    Link,
    is_our_process,
    netem_counters,
    netem_present,
    replica_links,
    run_tc,
    start_shim,
    stop_process,
    tc_argv,
)
from .plumbing import (
    SHIM_START_TIMEOUT_S as SHIM_START_TIMEOUT_S,
)

__all__ = ["inject_network_jitter", "remove_network_jitter"]

FAULT_KIND = "network-jitter"
#: The module the lab's fault ledger records (``module`` of a record): the historical name, a key
#: of :data:`chaoslib_infer.lab.registry.FAULT_MODULES`, re-exporting :func:`fault_active` and
#: :func:`undo_fault` from here, so records written before the move are still undone.
FAULT_MODULE = "chaoslib_infer.activities.network"
MECHANISMS = ("auto", "netem", "shim")


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def _event(lab: Lab, phase: str, record: dict[str, Any], by: str, **extra: Any) -> float:
    t = time.time()
    append_event(
        lab.state_dir / EVENTS_FILE,
        {
            "t": t,
            "event": FAULT_KIND,
            "phase": phase,
            "replica": record.get("replica"),
            "mechanism": record.get("mechanism"),
            "token": record.get("token"),
            "by": by,
            **extra,
        },
    )
    return t


def _num(name: str, value: Any, lo: float = 0.0, hi: float | None = None) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ActivityFailed(f"{name} must be a number, got {value!r}") from None
    if not v >= lo or (hi is not None and v > hi):
        bound = f"in [{lo:g}, {hi:g}]" if hi is not None else f">= {lo:g}"
        raise ActivityFailed(f"{name} must be {bound}, got {value!r}")
    return v


def _active_on(lab: Lab, replica: str) -> dict[str, Any] | None:
    for f in lab.status().get("active_faults", []):
        if f.get("kind") == FAULT_KIND and f.get("replica") == replica:
            return f
    return None


# --------------------------------------------------------------------------------------------
# undo contract (Lab.add_fault "module")
# --------------------------------------------------------------------------------------------
def fault_active(lab: Lab, record: dict[str, Any]) -> bool:
    """Whether a ``network-jitter`` fault is still in place (``Lab.status`` active faults).

    shim: the shim process still runs, or HAProxy's detour server still takes traffic.
    netem: ``tc qdisc show`` on the device still lists a netem qdisc.
    """
    if record.get("mechanism") == "netem":
        return netem_present(record) or is_our_process(
            int(record.get("watchdog_pid") or 0), str(record.get("token")), "sleep"
        )
    token = str(record.get("token") or "")
    if is_our_process(int(record.get("shim_pid") or 0), token, SHIM_MODULE):
        return True
    sock = lab.state_dir / HAPROXY_SOCK
    if not sock.exists():
        return False
    try:
        rows = haproxy_servers_state(sock, BACKEND)
    except OSError:
        return False  # HAProxy is down: it restarts from its configuration (no detour)
    detour = rows.get(str(record.get("detour")))
    return detour is not None and not int(detour.get("srv_admin_state", "0")) & ADMIN_FMAINT


def undo_fault(lab: Lab, record: dict[str, Any]) -> str | None:
    """Undo one ``network-jitter`` fault (idempotent).

    shim: route the replica's traffic back (its server ready, the detour server in maintenance:
    :func:`chaoslib_infer.lab.shim.restore_from_detour`), stop the shim (SIGTERM: it closes idle
    keep-alive connections, lets responses in flight finish for up to its ``drain_s`` and resets
    what is left; SIGKILL after ``drain_s + 3`` s), and delete the detour server.
    netem: ``tc qdisc del dev DEV root`` (in the namespace) and stop the dead-man watchdog.

    Returns:
        What was undone, or None when nothing was left.

    Raises:
        LabError: tc could not delete a netem qdisc that is still there.
    """
    token = str(record.get("token") or "")
    done: list[str] = []
    replica = str(record.get("replica"))
    if record.get("mechanism") == "netem":
        if netem_present(record):
            errors = []
            for args in tc_argv(record, "del"):
                try:
                    out = run_tc(args)
                except (OSError, subprocess.TimeoutExpired) as exc:
                    errors.append(str(exc))
                    continue
                if out.returncode != 0:
                    errors.append(out.stderr.strip())
            if netem_present(record):
                raise LabError(f"tc could not remove netem on {replica}: {'; '.join(errors)}")
            _event(lab, "removed", record, "undo")
            done.append("removed netem from " + ", ".join(str(x[1]) for x in record["links"]))
        if stop_process(int(record.get("watchdog_pid") or 0), token, "sleep", 1.0):
            done.append("stopped its watchdog")
        return f"network-jitter on {replica}: " + ", ".join(done) if done else None

    sock = lab.state_dir / HAPROXY_SOCK
    detour = str(record.get("detour") or "")
    if sock.exists() and detour:
        try:
            restored = restore_from_detour(sock, BACKEND, replica, detour)
        except OSError:
            restored = False  # HAProxy down: it restarts from its configuration (no detour)
        if restored:
            _event(
                lab, "removed", record, "undo", addr=f"{record['orig_addr']}:{record['orig_port']}"
            )
            done.append(f"HAProxy routes {replica} directly again")
    grace = float(record.get("drain_s") or DRAIN_S) + 3.0
    if stop_process(int(record.get("shim_pid") or 0), token, SHIM_MODULE, grace):
        done.append(f"stopped shim pid {record.get('shim_pid')}")
    if sock.exists() and detour:
        with contextlib.suppress(OSError):
            rows = haproxy_servers_state(sock, BACKEND)
            if detour in rows:
                if delete_detour(sock, BACKEND, detour):
                    done.append(f"deleted detour server {detour}")
                else:
                    done.append(f"detour server {detour} left in maintenance (connections open)")
    return f"network-jitter on {replica}: " + ", ".join(done) if done else None


# --------------------------------------------------------------------------------------------
# injection
# --------------------------------------------------------------------------------------------
def inject_network_jitter(
    replica: str = "auto",
    delay_ms: float = 400.0,
    jitter_ms: float = 300.0,
    loss_pct: float = 0.0,
    distribution: str = "normal",
    correlation_pct: float | None = None,
    duration_s: float = 20.0,
    mechanism: str = "auto",
    seed: int | None = None,
    dev: str | None = None,
    netns: str | None = None,
    drain_s: float = DRAIN_S,
    ttl_s: float | None = None,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Add latency with jitter (and optional loss) to one replica's link; it stays until
    :func:`remove_network_jitter` or the ``clear-lab-faults`` rollback removes it.

    With the ``shim`` mechanism each chunk of the byte stream, in both directions, is delayed by
    ``delay_ms`` +- ``jitter_ms`` (seeded ``normal`` or ``uniform`` draws, order preserved), and each
    chunk is "lost" with probability ``loss_pct``% by resetting the connection (a stream cannot lose
    bytes). With ``netem`` the kernel does the same per packet (TCP retransmits lost packets).

    Args:
        replica: replica name or ``"auto"`` (the first replica).
        delay_ms: mean added delay per direction, milliseconds.
        jitter_ms: jitter, milliseconds (normal: standard deviation).
        loss_pct: loss, percent (0..100).
        distribution: ``normal`` or ``uniform`` (netem also: ``pareto``, ``paretonormal``).
        correlation_pct: netem delay correlation, percent (ignored by the shim).
        duration_s: planned fault length, seconds (the default dead-man TTL is ``duration_s +
            30``).
        ttl_s: dead-man TTL, seconds (None: ``duration_s + 30``): the shim points HAProxy back and
            exits by itself then (netem: a detached watchdog deletes the qdiscs), and the lab's own
            fault watchdog undoes whatever is left.
        mechanism: ``auto`` (netem when available and the replica has a link device, else shim),
            ``netem`` or ``shim``.
        seed: seed of the shim's delay/loss draws (None: random).
        dev, netns: the link device and its network namespace for netem (default: from lab.json:
            a replica's ``dev``/``netns``, or both ends of its node's veth pair on a lab with
            network-namespace nodes, which every replica on that node then shares).
        drain_s: on removal, seconds the shim lets responses in flight finish before it resets
            them (idle keep-alive connections are closed at once; the shim ends as soon as no
            response is in flight).
        configuration: Chaos Toolkit configuration (``infer_lab_dir``, ``infer_run_dir``).

    Returns:
        The fault-log entry: ``{"kind": "network-jitter", "phase": "injected", "fault_at" (unix s:
        traffic starts crossing the jittery link), "fault_id", "token", "replica", "mechanism",
        "delay_ms", "jitter_ms", "loss_pct", "distribution", "duration_s", "ttl_s"}`` plus
        ``shim_pid``, ``shim_port``, ``stats_path``, ``orig_addr``, ``orig_port`` (shim) or
        ``links`` (``[[netns, dev], ...]``), ``add_args``, ``del_args``, ``watchdog_pid`` (netem).

    Raises:
        ActivityFailed: no lab, unknown replica, bad arguments, a jitter fault already active on the
            replica, netem asked for but unavailable, or the injection failed (nothing left behind).
    """
    lab = attach_lab(configuration)
    name = pick_replica(lab, replica)
    delay = _num("delay_ms", delay_ms)
    jitter = _num("jitter_ms", jitter_ms)
    loss = _num("loss_pct", loss_pct, 0.0, 100.0)
    duration = _num("duration_s", duration_s, 0.1)
    drain = _num("drain_s", drain_s)
    if mechanism not in MECHANISMS:
        raise ActivityFailed(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
    links: list[Link] = [(netns, dev)] if dev else replica_links(lab, name)
    if mechanism == "netem":
        ok, why = nm.netem_probe()
        if not ok:
            raise ActivityFailed(f"netem unavailable on this kernel ({why}); use mechanism shim")
        if not links:
            raise ActivityFailed(
                f"no link device known for {name} (loopback lab): pass dev/netns or use mechanism shim"
            )
    chosen = mechanism
    if mechanism == "auto":
        chosen = "netem" if links and nm.netem_available() else "shim"
    if chosen == "shim" and distribution not in ("normal", "uniform"):
        raise ActivityFailed(f"the shim supports normal and uniform jitter, not {distribution!r}")
    if _active_on(lab, name) is not None:
        raise ActivityFailed(f"a network-jitter fault is already active on {name}")
    token = f"nj{os.urandom(5).hex()}"
    ttl = duration + 30.0 if ttl_s is None else _num("ttl_s", ttl_s, 0.1)
    base: dict[str, Any] = {
        "kind": FAULT_KIND,
        "module": FAULT_MODULE,
        "replica": name,
        "mechanism": chosen,
        "token": token,
        "delay_ms": delay,
        "jitter_ms": jitter,
        "loss_pct": loss,
        "distribution": distribution,
        "duration_s": duration,
        "ttl_s": ttl,
        "drain_s": drain,
    }
    if chosen == "netem":
        try:
            adds = [
                nm.netem_add_args(d, delay, jitter, loss, correlation_pct, distribution, ns)
                for ns, d in links
            ]
            record = {
                **base,
                "links": [[ns, d] for ns, d in links],
                "add_args": adds,
                "del_args": [nm.netem_del_args(d, ns) for ns, d in links],
                "show_args": [nm.netem_show_args(d, ns) for ns, d in links],
            }
        except ValueError as exc:
            raise ActivityFailed(str(exc)) from exc
        undo_cmd = "; ".join(shlex.join(a) for a in record["del_args"])
        watchdog = subprocess.Popen(  # dead-man: the qdiscs go away after the TTL in any case
            ["sh", "-c", f"sleep {ttl:g}; {undo_cmd}", token],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=child_env(),  # it outlives the drill: never the API key
        )
        CHILDREN[watchdog.pid] = watchdog
        record["watchdog_pid"] = watchdog.pid
        try:
            fault_id = lab.add_fault(record)
        except LabError as exc:
            stop_process(watchdog.pid, token, "sleep", 1.0)
            raise ActivityFailed(str(exc)) from exc
        for args in adds:
            out = run_tc(args, timeout_s=10.0)
            if out.returncode != 0:
                lab.remove_fault(fault_id)
                raise ActivityFailed(
                    f"tc netem failed on {name}: {out.stderr.strip() or out.returncode}"
                )
        fault_at = _event(lab, "applied", record, "inject")
    else:
        sock = lab.state_dir / HAPROXY_SOCK
        detour = f"{name}-jitter"
        try:
            rows = haproxy_servers_state(sock, BACKEND)
        except OSError as exc:
            raise ActivityFailed(f"HAProxy runtime API not answering: {exc}") from exc
        if name not in rows:
            raise ActivityFailed(f"HAProxy has no server {BACKEND}/{name}")
        if detour in rows:
            raise ActivityFailed(f"HAProxy already has a detour {BACKEND}/{detour} (stale fault?)")
        addr, port = rows[name]["srv_addr"], int(rows[name]["srv_port"])
        proc, shim_port, stats = start_shim(
            lab, name, (addr, port), token, delay, jitter, loss, distribution, seed, ttl, drain
        )
        record = {
            **base,
            "shim_pid": proc.pid,
            "shim_port": shim_port,
            "stats_path": str(stats),
            "orig_addr": addr,
            "orig_port": port,
            "backend": BACKEND,
            "detour": detour,
            "seed": seed,
        }
        try:
            fault_id = lab.add_fault(record)
        except LabError as exc:
            stop_process(proc.pid, token, SHIM_MODULE, 1.0)
            raise ActivityFailed(str(exc)) from exc
        try:
            options = default_server_options(lab.state_dir / "haproxy.cfg")
            divert_to_detour(sock, BACKEND, name, detour, shim_port, options)
        except (OSError, RuntimeError) as exc:
            lab.remove_fault(fault_id)
            raise ActivityFailed(f"cannot route {name} through the jitter shim: {exc}") from exc
        fault_at = _event(
            lab, "applied", record, "inject", addr=f"127.0.0.1:{shim_port}", detour=detour
        )
    entry = {
        **{k: v for k, v in record.items() if k != "module"},
        "phase": "injected",
        "fault_id": fault_id,
        "fault_at": fault_at,
    }
    log_fault(configuration, entry)
    return entry


def remove_network_jitter(
    replica: str = "auto", configuration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Remove the network jitter injected by the last :func:`inject_network_jitter` of this run.

    Args:
        replica: ``"auto"`` (the replica of the last injection) or a replica name (must match).
        configuration: Chaos Toolkit configuration.

    Returns:
        ``{"kind": "network-jitter", "phase": "cleared", "fault_id", "replica", "mechanism",
        "cleared_at" (unix s), "undone" (what was undone; None when the fault was already gone,
        e.g. after its TTL)}``; netem adds ``"netem"``: ``{"bytes", "packets"}`` sent through
        its qdiscs, read just before their removal (None when tc could not say).

    Raises:
        ActivityFailed: no injection recorded in this run, another replica named, or the undo failed.
    """
    lab = attach_lab(configuration)
    fault = last_fault(configuration, FAULT_KIND)
    if fault is not None and fault.get("phase") == "cleared":
        fault = None  # the last injection was already removed
    if fault is None:
        raise ActivityFailed("no network-jitter fault to remove in this run")
    name = str(fault["replica"])
    if replica not in ("auto", "", None) and pick_replica(lab, replica) != name:
        raise ActivityFailed(f"the last network-jitter fault is on {name}, not {replica}")
    counters = None
    if fault.get("mechanism") == "netem":  # what the qdisc delayed, read before it goes
        live = [f for f in lab.active_faults() if f.get("id") == fault["fault_id"]]
        counters = netem_counters(live[0] if live else fault)
    try:
        note = lab.remove_fault(str(fault["fault_id"]))
    except LabError as exc:
        raise ActivityFailed(str(exc)) from exc
    entry = {
        "kind": FAULT_KIND,
        "phase": "cleared",
        "fault_id": fault["fault_id"],
        "token": fault.get("token"),
        "replica": name,
        "mechanism": fault.get("mechanism"),
        "cleared_at": time.time(),
        "undone": note,
    }
    if fault.get("mechanism") == "netem":
        entry["netem"] = counters
    log_fault(configuration, entry)
    return entry
