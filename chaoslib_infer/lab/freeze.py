"""Upstream timeout: one replica stops answering while its listening socket stays open.

The fault behind drill 3 (``experiments/upstream-timeout.yaml``). Three variants (``mode``):

``freeze`` (default)
    The cgroup freezer stops every process of the replica. Where the lab's replica cgroups are
    cgroup v2, the replica's own cgroup is frozen (``cgroup.freeze = 1``). Where they are v1 memory
    cgroups, the replica's processes move into a freezer cgroup of their own
    (``<freezer base>/chaos-infer-<lab id>-freeze-<replica>``) on the v1 ``freezer`` controller
    (``freezer.state = FROZEN``) or, without it, on the v2 unified hierarchy (``cgroup.freeze``);
    the memory cgroup does not change (different hierarchy). With no usable freezer the fault
    falls back to ``sigstop`` and the record says why (``fallback_reason``).
``sigstop``
    ``SIGSTOP`` to every process of the replica (state ``T``); ``SIGCONT`` thaws it.
``blackhole``
    An iptables ``DROP`` rule for the replica's port inside its network namespace (lab "nodes").
    A lab whose replicas run on the host's loopback has no such namespace: :class:`LabError`.

In every mode the kernel keeps the listening socket: new TCP handshakes still complete (backlog)
for ``freeze``/``sigstop``, so the gateway connects, sends the request and waits for an answer
that never comes, until its ``timeout server`` or the client gives up. supervisord cannot restart a
frozen process (it is not dead); only the gateway's health check (``inter 500ms fall 2``,
``timeout check 1s``) can eject it.

Rollback ledger: :func:`freeze_replica` records the fault with ``lab.add_fault`` *before* freezing;
:func:`undo_fault` thaws (idempotent) and :func:`fault_active` reads the freezer state (or the
process state ``T``, or the iptables rule). Dead-man switch: a detached timer process
(``python -m chaoslib_infer.lab.freeze deadman``, its own session, outside the lab's cgroups)
thaws the replica ``ttl_s`` seconds after injection even if the runner that froze it was
SIGKILLed, and appends a ``{"event": "fault", "phase": "cleared", "by": "deadman"}`` line to the
lab's ``events.jsonl``; a normal rollback kills the timer. The timer lives outside the lab's
supervisord, so it also covers a lab whose supervisord died; the record's ``ttl_s`` additionally
lets the lab's own watchdog (:mod:`chaoslib_infer.lab.deadman`) undo it.

Freezer discovery and the ``/proc`` / control-file helpers live in :mod:`chaoslib_infer.lab.freezer`
(``find_freezer`` and ``FREEZERS`` are re-exported here).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaoslib_infer.lab import processes, procfs
from chaoslib_infer.lab.cgroups import MemoryCgroup, rmdir_when_drained
from chaoslib_infer.lab.freezer import FREEZERS as FREEZERS
from chaoslib_infer.lab.freezer import find_freezer as find_freezer
from chaoslib_infer.lab.freezer import (
    is_stopped,
    pid_cgroup,
    read_control,
    same_process,
    write_control,
)
from chaoslib_infer.lab.recorder import EVENTS_FILE, append_event
from chaoslib_infer.lab.statedir import LabError

if TYPE_CHECKING:
    from chaoslib_infer.lab.fleet import Lab

__all__ = [
    "KIND",
    "MODES",
    "MODULE",
    "fault_active",
    "find_freezer",
    "freeze_replica",
    "is_frozen",
    "main",
    "prepare",
    "inject",
    "spawn_deadman",
    "thaw",
    "undo_fault",
]

KIND = "upstream-timeout"
MODULE = "chaoslib_infer.lab.freeze"
MODES = ("freeze", "sigstop", "blackhole")
DEFAULT_TTL_S = 120.0
_SETTLE_S = 5.0  # how long a freezer may stay FREEZING/THAWING
_NETNS = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


# --------------------------------------------------------------------------------------------
# Prepare / inject / thaw (work on a plain record; no Lab needed, so tests can use any process)
# --------------------------------------------------------------------------------------------
def prepare(
    pids: list[int],
    name: str,
    mode: str = "freeze",
    freezer: str = "auto",
    own_cgroup: tuple[int, str] | None = None,
    netns: str | None = None,
    port: int | None = None,
) -> dict[str, Any]:
    """Describe a freeze of ``pids`` without touching anything (the rollback record's core).

    Args:
        pids: processes to freeze (the replica's engine and its children).
        name: unique name of the fault's freezer cgroup (``chaos-infer-<lab>-freeze-<replica>``).
        mode: ``freeze`` | ``sigstop`` | ``blackhole``.
        freezer: ``auto`` | ``v1`` | ``v2`` (``freeze`` mode only).
        own_cgroup: ``(2, path)`` when the processes already sit alone in a cgroup v2 directory
            (the lab's replica cgroup on a v2 lab): that cgroup is frozen in place.
        netns, port: the replica's network namespace and port (``blackhole`` only).

    Returns:
        JSON-able mapping: ``mode`` (what will be done; ``freeze`` may become ``sigstop``),
        ``requested_mode``, ``pid``, ``pids``, ``starttimes``, ``freezer`` (1, 2 or None),
        ``cgroup``, ``moved`` (processes move into a cgroup created for the fault), ``homes``
        (``{pid: cgroup to move back to}``), ``fallback_reason``, ``netns``, ``port``.

    Raises:
        LabError: unknown mode, no process, or ``blackhole`` without a network namespace.
    """
    if mode not in MODES:
        raise LabError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    live = [p for p in pids if procfs.start_time(p) is not None]
    if not live:
        raise LabError(f"no running process to freeze for {name}")
    rec: dict[str, Any] = {
        "mode": mode,
        "requested_mode": mode,
        "pid": live[0],
        "pids": live,
        "starttimes": {str(p): procfs.start_time(p) for p in live},
        "freezer": None,
        "cgroup": None,
        "moved": False,
        "homes": {},
        "fallback_reason": None,
        "netns": None,
        "port": None,
    }
    if mode == "blackhole":
        if not netns:
            raise LabError(
                f"mode 'blackhole' needs network-namespace nodes (Lab.up(nodes=N), plan lab: "
                f"{{nodes: N}}); {name} runs on the host's loopback: use mode 'freeze' or 'sigstop'"
            )
        if not _NETNS.match(netns) or not port or not 0 < int(port) < 65536:
            raise LabError(f"bad network namespace {netns!r} or port {port!r} for {name}")
        if shutil.which("iptables") is None:
            raise LabError("mode 'blackhole' needs iptables (apt-get install iptables)")
        rec.update(netns=netns, port=int(port))
        return rec
    if mode == "sigstop":
        return rec
    if own_cgroup is not None and int(own_cgroup[0]) == 2 and freezer in ("auto", "v2"):
        path = Path(own_cgroup[1])
        if (path / "cgroup.freeze").exists():
            rec.update(freezer=2, cgroup=str(path), moved=False)
            return rec
    found = find_freezer(freezer)
    if found is None:
        rec.update(
            mode="sigstop",
            fallback_reason=f"no writable freezer cgroup hierarchy ({freezer}); SIGSTOP instead",
        )
        return rec
    version, base = found
    homes = {}
    for p in live:
        home = pid_cgroup(p, version)
        homes[str(p)] = str(home if home is not None else base)
    rec.update(freezer=version, cgroup=str(base / name), moved=True, homes=homes)
    return rec


def _freezer_state(rec: dict[str, Any]) -> str | None:
    """``FROZEN`` / ``FREEZING`` / ``THAWED`` (v1 names, also for v2), None without the cgroup."""
    path = Path(str(rec["cgroup"]))
    if int(rec["freezer"]) == 1:
        return read_control(path / "freezer.state")
    want = read_control(path / "cgroup.freeze")
    if want is None:
        return None
    events = read_control(path / "cgroup.events") or ""
    frozen = "frozen 1" in events.splitlines()
    if want == "1":
        return "FROZEN" if frozen else "FREEZING"
    return "THAWED"


def _cgroup_pids(path: Path) -> list[int]:
    text = read_control(path / "cgroup.procs")
    return [int(x) for x in text.split()] if text else []


def _iptables_rule(rec: dict[str, Any]) -> list[str]:
    return [
        "INPUT",
        "-p",
        "tcp",
        "--dport",
        str(int(rec["port"])),
        "-m",
        "comment",
        "--comment",
        f"chaos-infer-{rec.get('name', 'blackhole')}",
        "-j",
        "DROP",
    ]


def _iptables(rec: dict[str, Any], op: str) -> subprocess.CompletedProcess[str]:
    argv = ["ip", "netns", "exec", str(rec["netns"]), "iptables", "-w", op, *_iptables_rule(rec)]
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=10, env=processes.lab_child_env()
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"iptables in netns {rec['netns']}: {exc}") from exc


def inject(rec: dict[str, Any]) -> float:
    """Apply the fault described by ``rec`` (from :func:`prepare`).

    Returns:
        Unix time the fault took effect (the freezer was told to freeze / the signals were sent).

    Raises:
        LabError: the freezer or iptables refused, or the cgroup did not reach ``FROZEN`` within
            5 s. The caller undoes with :func:`thaw`.
    """
    mode = rec["mode"]
    if mode == "sigstop":
        t = time.time()
        targets = [
            int(p) for p in rec["pids"] if same_process(int(p), rec["starttimes"].get(str(p)))
        ]
        for p in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGSTOP)
        deadline = time.monotonic() + _SETTLE_S
        while not all(is_stopped(p) or procfs.start_time(p) is None for p in targets):
            if time.monotonic() > deadline:
                raise LabError(f"pid(s) {targets} not stopped {_SETTLE_S:g} s after SIGSTOP")
            time.sleep(0.002)
        return t
    if mode == "blackhole":
        t = time.time()
        done = _iptables(rec, "-I")
        if done.returncode != 0:
            first = (done.stderr or done.stdout).strip().splitlines()[:1]
            raise LabError(f"iptables DROP in netns {rec['netns']} failed: {first}")
        return t
    path = Path(str(rec["cgroup"]))
    if rec["moved"]:
        try:
            path.mkdir(exist_ok=True)
        except OSError as exc:
            raise LabError(f"cannot create freezer cgroup {path}: {exc.strerror}") from exc
        for p in rec["pids"]:
            if same_process(int(p), rec["starttimes"].get(str(p))):
                write_control(path / "cgroup.procs", f"{p}\n")
    if int(rec["freezer"]) == 1:
        t = time.time()
        write_control(path / "freezer.state", "FROZEN")
    else:
        t = time.time()
        write_control(path / "cgroup.freeze", "1")
    deadline = time.monotonic() + _SETTLE_S
    while _freezer_state(rec) != "FROZEN":
        if time.monotonic() > deadline:
            raise LabError(f"freezer cgroup {path} did not reach FROZEN within {_SETTLE_S:g} s")
        time.sleep(0.002)
    return t


def is_frozen(rec: dict[str, Any]) -> bool:
    """True while the fault of ``rec`` is in effect (freezer state, process state ``T``, or the
    iptables rule)."""
    mode = rec.get("mode")
    if mode == "sigstop":
        return any(
            same_process(int(p), rec["starttimes"].get(str(p))) and is_stopped(int(p))
            for p in rec.get("pids", [])
        )
    if mode == "blackhole":
        return _iptables(rec, "-C").returncode == 0
    if not rec.get("cgroup"):
        return False
    state = _freezer_state(rec)
    if state not in ("FROZEN", "FREEZING"):
        return False
    return bool(_cgroup_pids(Path(str(rec["cgroup"]))))


def thaw(rec: dict[str, Any]) -> str | None:
    """Undo the fault of ``rec``: thaw, move the processes back home, remove the freezer cgroup.

    Idempotent: a second call (or one for a fault never injected) does nothing.

    Returns:
        What was undone, or None when nothing was left to undo.

    Raises:
        LabError: the freezer would not thaw (cgroupfs write refused).
    """
    mode = rec.get("mode")
    who = rec.get("replica") or rec.get("name") or "?"
    if mode == "sigstop":
        stopped = []
        for p in rec.get("pids", []):
            if same_process(int(p), rec["starttimes"].get(str(p))):
                if is_stopped(int(p)):
                    stopped.append(int(p))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(p), signal.SIGCONT)
        return f"upstream-timeout on {who}: SIGCONT to pid(s) {stopped}" if stopped else None
    if mode == "blackhole":
        removed = 0
        while removed < 16 and _iptables(rec, "-C").returncode == 0:
            _iptables(rec, "-D")
            removed += 1
        return (
            f"upstream-timeout on {who}: removed DROP rule in netns {rec['netns']}"
            if removed
            else None
        )
    if not rec.get("cgroup"):
        return None
    path = Path(str(rec["cgroup"]))
    if not path.is_dir():
        return None
    note = None
    state = _freezer_state(rec)
    if state in ("FROZEN", "FREEZING"):
        if int(rec["freezer"]) == 1:
            write_control(path / "freezer.state", "THAWED")
        else:
            write_control(path / "cgroup.freeze", "0")
        deadline = time.monotonic() + _SETTLE_S
        while _freezer_state(rec) not in ("THAWED", None) and time.monotonic() < deadline:
            time.sleep(0.002)
        note = f"upstream-timeout on {who}: thawed {path} (cgroup v{rec['freezer']} freezer)"
    if rec.get("moved"):
        homes = {int(k): Path(v) for k, v in (rec.get("homes") or {}).items()}
        fallback = path.parent
        for p in _cgroup_pids(path):
            home = homes.get(p, fallback)
            try:
                write_control((home if home.is_dir() else fallback) / "cgroup.procs", f"{p}\n")
            except LabError:
                write_control(fallback / "cgroup.procs", f"{p}\n")
        deadline = time.monotonic() + _SETTLE_S
        try:
            rmdir_when_drained(path, deadline, 0.01)
        except OSError as exc:
            raise LabError(f"cannot remove freezer cgroup {path}: {exc.strerror}") from exc
        note = note or f"upstream-timeout on {who}: removed freezer cgroup {path}"
    return note


# --------------------------------------------------------------------------------------------
# Dead-man timer
# --------------------------------------------------------------------------------------------
def spawn_deadman(rec: dict[str, Any], ttl_s: float, state_dir: Path | None = None) -> int:
    """Start the detached timer that thaws ``rec`` after ``ttl_s`` seconds; returns its pid.

    The timer runs in its own session (a SIGKILL of the runner's process group does not reach it)
    and in the runner's cgroups (never frozen with the replica, not killed by ``lab down``'s cgroup
    sweep). :func:`undo_fault` kills it.
    """
    env = processes.lab_child_env()  # lab children never get the API key
    argv = [
        sys.executable,
        "-m",
        MODULE,
        "deadman",
        "--ttl-s",
        f"{float(ttl_s):g}",
        "--record",
        json.dumps(rec, separators=(",", ":")),
    ]
    if state_dir is not None:
        argv += ["--state-dir", str(state_dir)]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        env=env,
    )
    return proc.pid


def _is_deadman(pid: int) -> bool:
    cmd = procfs.cmdline(pid)
    return MODULE in cmd and " deadman " in cmd and procfs.state(pid) not in (None, "Z")


def _stop_deadman(rec: dict[str, Any]) -> None:
    pid = int(rec.get("deadman_pid") or 0)
    if pid and _is_deadman(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)


def run_deadman(rec: dict[str, Any], ttl_s: float, state_dir: Path | None) -> int:
    """Sleep ``ttl_s`` seconds, then thaw ``rec`` and log it to the lab's events. Returns 0."""
    time.sleep(max(0.0, float(ttl_s)))
    try:
        note = thaw(rec)
    except LabError as exc:
        note = f"dead-man thaw FAILED: {exc}"
    if note and state_dir is not None and (state_dir / EVENTS_FILE).exists():
        append_event(
            state_dir / EVENTS_FILE,
            {
                "t": time.time(),
                "event": "fault",
                "kind": KIND,
                "replica": rec.get("replica"),
                "phase": "cleared",
                "by": "deadman",
                "note": note,
            },
        )
    return 0


# --------------------------------------------------------------------------------------------
# Lab integration (rollback ledger)
# --------------------------------------------------------------------------------------------
def _replica_meta(lab: Lab, replica: str) -> dict[str, Any]:
    for rep in lab.meta["replicas"]:
        if rep["name"] == replica:
            return dict(rep)
    raise LabError(f"unknown replica {replica!r}; the lab has {', '.join(lab.replica_names())}")


def freeze_replica(
    lab: Lab,
    replica: str,
    mode: str = "freeze",
    ttl_s: float = DEFAULT_TTL_S,
    freezer: str = "auto",
) -> dict[str, Any]:
    """Make ``replica`` stop answering with its socket left open; record the fault first.

    Args:
        lab: the running lab.
        replica: replica name (``r0``...).
        mode: ``freeze`` (cgroup freezer, SIGSTOP fallback) | ``sigstop`` | ``blackhole``.
        ttl_s: dead-man delay in seconds: the replica is thawed after it whatever happens.
        freezer: ``auto`` | ``v1`` | ``v2`` freezer hierarchy (``freeze`` mode).

    Returns:
        The fault record (see :func:`prepare`) plus ``id`` (lab fault id), ``fault_at`` (unix s),
        ``deadman_pid``, ``ttl_s``, ``replica``, ``kind``, ``module``.

    Raises:
        LabError: unknown or stopped replica, a fault already active on it, ``blackhole`` without
            nodes, or the freeze failed (already undone).
    """
    rep = _replica_meta(lab, replica)
    if not ttl_s or float(ttl_s) <= 0:
        raise LabError(f"ttl_s must be positive, got {ttl_s!r}")
    if any(f.get("replica") == replica for f in lab.status()["active_faults"]):
        raise LabError(f"a fault is already active on {replica}")
    main_pid = lab.replica_pid(replica)
    if not main_pid:
        raise LabError(f"replica {replica} is not running")
    version = int(lab.meta["cgroup_version"])
    members = MemoryCgroup(Path(rep["cgroup"]), version).pids()
    pids = [main_pid, *[p for p in members if p != main_pid]]
    name = f"chaos-infer-{lab.meta['lab_id']}-freeze-{replica}"
    netns = None
    if mode == "blackhole" and lab.meta.get("nodes"):
        from chaoslib_infer.lab.netns import read_placement

        netns = (read_placement(lab.state_dir).get(replica) or {}).get("ns")
    rec = prepare(
        pids,
        name,
        mode=mode,
        freezer=freezer,
        own_cgroup=(version, rep["cgroup"]) if version == 2 else None,
        netns=netns,
        port=int(rep["port"]),
    )
    rec.update(
        kind=KIND,
        module=MODULE,
        replica=replica,
        name=name,
        ttl_s=float(ttl_s),
        state_dir=str(lab.state_dir),
    )
    rec["deadman_pid"] = spawn_deadman(rec, float(ttl_s), lab.state_dir)
    fault_id = lab.add_fault(rec)
    rec["id"] = fault_id
    try:
        fault_at = inject(rec)
    except BaseException:
        lab.remove_fault(fault_id)
        raise
    return {**rec, "fault_at": fault_at}


def undo_fault(lab: Lab, record: dict[str, Any]) -> str | None:
    """Thaw the replica of ``record`` and stop its dead-man timer (idempotent).

    Returns:
        What was undone, or None when nothing was frozen any more.
    """
    try:
        return thaw(record)
    finally:
        _stop_deadman(record)


def fault_active(lab: Lab, record: dict[str, Any]) -> bool:
    """True while the replica of ``record`` is frozen / stopped / black-holed."""
    return is_frozen(record)


def main(argv: list[str] | None = None) -> int:
    """``python -m chaoslib_infer.lab.freeze deadman --ttl-s S --record JSON [--state-dir D]``."""
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    dm = sub.add_parser("deadman", help="thaw a frozen replica after --ttl-s seconds")
    dm.add_argument("--ttl-s", type=float, required=True)
    dm.add_argument("--record", required=True, help="the fault record (JSON)")
    dm.add_argument("--state-dir", type=Path, default=None, help="lab state dir (events.jsonl)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the TTL (or a SIGKILL) ends the timer
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    return run_deadman(json.loads(args.record), args.ttl_s, args.state_dir)


if __name__ == "__main__":
    sys.exit(main())
