"""The fault ledger is data, not an executable plan (issue 13).

A lab's ``faults.json`` sits in a folder others can write (``--out``) and the lab's dead-man
watchdog replays it as root. Each case below plants one tampered record (an ``rm -rf`` argv, a
module that is not a fault module, a pid, cgroup, namespace, replica, node, port or marker that
is not this lab's, a malformed id) in the ledger of a lab described by its ``lab.json`` (replica
cgroups stood in for by folders whose ``cgroup.procs`` the test writes), then drives every path
that replays a ledger: ``chaos-infer rollback`` (and ``--dry-run``), the dead-man's
``expire_once``, ``Lab.clear_faults`` (``lab down``) and ``Lab.status``'s active faults. Each must
refuse the record with one line and run nothing of it: the victim folder is intact, the command the
record carries never ran, the foreign process is still stopped, the foreign module was never
imported, and the ledger still holds the record (a refused record is never forgotten).

A genuine record of the same lab (a stopped replica process in its cgroup, a marker holding its
fault id) is undone as before, so the checks do not simply refuse everything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from chaoslib_infer.cli import main
from chaoslib_infer.lab import deadman, registry
from chaoslib_infer.lab.fleet import Lab

LAB_ID = "t9"
TOKEN = "nj0123456789"
EVIL = "chaos_infer_evil_fault_module"


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return None


def _start(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]


def _wait_state(pid: int, want: str) -> None:
    deadline = time.monotonic() + 5
    while _state(pid) != want and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _state(pid) == want, (pid, _state(pid))


@dataclass
class World:
    """A lab's state folder with its ``lab.json``, and what a tampered record would damage."""

    root: Path
    lab_dir: Path
    victim: Path  # a folder an ``rm -rf`` would remove
    pwned: Path  # a file a planted command would create
    imported: Path  # a file the planted module writes when imported
    foreign: int  # a stopped process that is not the lab's
    own: int  # a stopped process in replica r0's cgroup
    timer: int  # another fault's dead-man timer (by its command line)

    def lab(self) -> Lab:
        return Lab.attach(self.lab_dir)

    def ledger_text(self) -> str:
        return (self.lab_dir / "faults.json").read_text()

    def plant(self, records: list[dict[str, Any]]) -> None:
        (self.lab_dir / "faults.json").write_text(json.dumps(records))

    def nothing_ran(self) -> None:
        assert sorted(p.name for p in self.victim.iterdir()) == ["precious"]
        assert not self.pwned.exists()
        assert not self.imported.exists() and EVIL not in sys.modules
        assert _state(self.foreign) == "T"  # neither continued nor killed
        assert _state(self.timer) in ("S", "R")  # not killed


@pytest.fixture()
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    root = tmp_path
    lab_dir = root / "lab"
    lab_dir.mkdir()
    cgroups = {}
    for name in ("r0", "r1"):
        cg = root / "cg" / f"chaos-infer-{LAB_ID}" / name
        cg.mkdir(parents=True)
        (cg / "cgroup.procs").write_text("")
        cgroups[name] = cg
    victim = root / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    imported = root / "imported"
    (root / f"{EVIL}.py").write_text(f"open({str(imported)!r}, 'w').write('imported')\n")
    monkeypatch.syspath_prepend(str(root))
    procs = [subprocess.Popen(["sleep", "120"]) for _ in range(2)]
    foreign, own = (p.pid for p in procs)
    # another fault's dead-man timer, as its command line reads (module, "deadman", its record)
    timer = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"]
        + ["chaoslib_infer.lab.freeze", "deadman", "--record", '{"name":"chaos-infer-x-freeze-r0"}']
    )
    for pid in (foreign, own):
        os.kill(pid, signal.SIGSTOP)
        _wait_state(pid, "T")
    (cgroups["r0"] / "cgroup.procs").write_text(f"{own}\n")
    meta = {
        "lab_id": LAB_ID,
        "state_dir": str(lab_dir),
        "url": "http://127.0.0.1:1",
        "port": 1,
        "engine": "sim",
        "cgroup_version": 2,
        "cgroup_root": str(root / "cg" / f"chaos-infer-{LAB_ID}"),
        "replicas": [
            {"name": "r0", "port": 18001, "cgroup": str(cgroups["r0"]), "node": "n0"},
            {"name": "r1", "port": 18002, "cgroup": str(cgroups["r1"]), "node": "n1"},
        ],
        "nodes": [
            {"name": n, "ns": f"chaosinfer-{LAB_ID}-{n}", "ip": f"10.213.{i}.2"}
            | {"veth_root": f"ci{LAB_ID}r{i}", "veth_node": f"ci{LAB_ID}n{i}"}
            for i, n in enumerate(("n0", "n1"))
        ],
        "pids": {},
    }
    (lab_dir / "lab.json").write_text(json.dumps(meta))
    try:
        yield World(root, lab_dir, victim, root / "pwned", imported, foreign, own, timer.pid)
    finally:
        for p in [*procs, timer]:
            p.kill()
            p.wait(timeout=5)
        sys.modules.pop(EVIL, None)


# --------------------------------------------------------------------------------------------
# the tampered records
# --------------------------------------------------------------------------------------------
def _jitter(w: World, **extra: Any) -> dict[str, Any]:
    links = [[None, f"ci{LAB_ID}r0"], [f"chaosinfer-{LAB_ID}-n0", f"ci{LAB_ID}n0"]]
    rec = {
        "kind": "network-jitter",
        "module": "chaoslib_infer.activities.network",
        "id": "network-jitter-0badc0de",
        "replica": "r0",
        "mechanism": "netem",
        "token": TOKEN,
        "links": links,
        "ttl_s": 1.0,
        "injected_at": 1.0,
    }
    return {**rec, **extra}


def _freeze(w: World, **extra: Any) -> dict[str, Any]:
    rec = {
        "kind": "upstream-timeout",
        "module": "chaoslib_infer.lab.freeze",
        "id": "upstream-timeout-0badc0de",
        "replica": "r0",
        "name": f"chaos-infer-{LAB_ID}-freeze-r0",
        "mode": "sigstop",
        "pids": [],
        "starttimes": {},
        "ttl_s": 1.0,
        "injected_at": 1.0,
    }
    return {**rec, **extra}


CASES: dict[str, tuple[Callable[[World], dict[str, Any]], str]] = {
    # stored argv: the undo would have run `rm -rf VICTIM`, the status check `touch PWNED`
    "argv-rm-rf": (
        lambda w: _jitter(
            w,
            del_args=[["rm", "-rf", str(w.victim)]],
            show_args=[["touch", str(w.pwned)]],
        ),
        "del_args is not the lab's own tc command",
    ),
    "argv-sh-c": (
        lambda w: _jitter(w, show_args=[["sh", "-c", f"touch {w.pwned}"]]),
        "show_args is not the lab's own tc command",
    ),
    "link-not-of-this-lab": (
        lambda w: _jitter(w, links=[[None, "eth0"]]),
        "link [None, 'eth0'] is not a link of this lab",
    ),
    "foreign-module": (
        lambda w: {"kind": "test-marker", "module": EVIL, "path": str(w.pwned)},
        f"module {EVIL} is not in the registry of fault modules",
    ),
    "stdlib-module": (
        lambda w: {"kind": "test-marker", "module": "os", "path": str(w.pwned)},
        "module os is not in the registry",
    ),
    "package-module-not-a-fault-module": (
        lambda w: {"kind": "oom-kill", "module": "chaoslib_infer.lab.hog", "pid": w.foreign},
        "module chaoslib_infer.lab.hog is not in the registry",
    ),
    "kind-of-another-module": (
        lambda w: {"kind": "node-loss", "module": "chaoslib_infer.lab.scaling", "node": "n0"},
        "kind node-loss is not a kind of chaoslib_infer.lab.scaling",
    ),
    "module-less-not-a-hog": (
        lambda w: {"kind": "network-jitter", "del_args": [["rm", "-rf", str(w.victim)]]},
        "kind network-jitter needs a fault module",
    ),
    "foreign-pid-sigstop": (
        lambda w: {
            "kind": "test-sigstop",
            "module": "chaoslib_infer.lab.testfault",
            "id": "test-sigstop-0badc0de",
            "replica": "r0",
            "pid": w.foreign,
            "start_time": _start(w.foreign),
        },
        "is not a process of this lab",
    ),
    "foreign-pid-freeze": (
        lambda w: _freeze(w, pids=[w.foreign], starttimes={str(w.foreign): int(_start(w.foreign))}),
        "is not a process of this lab",
    ),
    "foreign-pid-hog": (
        lambda w: {"kind": "oom-kill", "replica": "r0", "pid": w.foreign, "hog_pid": w.foreign},
        "is not a process of this lab",
    ),
    "foreign-deadman-timer": (
        lambda w: _freeze(w, deadman_pid=w.timer),
        "is another fault's dead-man timer",
    ),
    "foreign-cgroup": (
        lambda w: _freeze(w, mode="freeze", freezer=2, moved=True, cgroup=str(w.victim)),
        "is not named chaos-infer-t9-freeze-r0",
    ),
    "foreign-fault-name": (
        lambda w: _freeze(w, name="chaos-infer-other-freeze-r0"),
        "is not this lab's chaos-infer-t9-freeze-r0",
    ),
    "foreign-netns": (
        lambda w: _freeze(w, mode="blackhole", netns="prod-netns", port=18001),
        "netns prod-netns is not a network namespace of this lab",
    ),
    "foreign-replica": (
        lambda w: {
            "kind": "quota-cut",
            "module": "chaoslib_infer.lab.scaling",
            "id": "quota-cut-0badc0de",
            "stopped": ["r0", "haproxy"],
        },
        "stopped haproxy is not a replica of this lab",
    ),
    "foreign-node": (
        lambda w: {
            "kind": "node-loss",
            "module": "chaoslib_infer.lab.nodes",
            "id": "node-loss-0badc0de",
            "node": "gpu-prod-1",
            "replicas": ["r0"],
        },
        "node gpu-prod-1 is not a node of this lab",
    ),
    "foreign-port": (
        lambda w: {
            "kind": "engine-fault",
            "module": "chaoslib_infer.activities.engine_faults",
            "id": "engine-fault-0badc0de",
            "replica": "r0",
            "port": 22,
            "host": "10.0.0.1",
            "mode": "hang",
        },
        "port 22 is not r0's port 18001",
    ),
    "foreign-marker": (
        lambda w: {
            "kind": "test-marker",
            "module": "chaoslib_infer.lab.testfault",
            "id": "test-marker-0badc0de",
            "path": str(w.victim / "precious"),
        },
        "is not this fault's marker",
    ),
    "malformed-id": (
        lambda w: {
            "kind": "test-marker",
            "module": "chaoslib_infer.lab.testfault",
            "id": "test-marker-1; rm -rf /",
            "path": str(w.pwned),
        },
        "is not a fault id of this lab",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_tampered_record_is_refused_with_one_line_and_nothing_runs(
    world: World, case: str
) -> None:
    build, why = CASES[case]
    record = build(world)
    world.plant([record])
    planted = world.ledger_text()

    # chaos-infer rollback: the whole ledger is checked first; one line, exit 2, nothing undone
    r = CliRunner().invoke(main, ["rollback", "--state-dir", str(world.lab_dir)])
    assert r.exit_code == 2, r.output
    (line,) = r.stderr.splitlines()
    assert line.startswith("chaos-infer: error: ") and "refused" in line, line
    assert why in line, line
    assert "nothing was undone" in line and "Traceback" not in r.output
    assert r.stdout == ""
    assert world.ledger_text() == planted
    world.nothing_ran()

    # --dry-run says so too
    r = CliRunner().invoke(main, ["rollback", "--state-dir", str(world.lab_dir), "--dry-run"])
    assert r.exit_code == 2 and r.stdout.startswith("refused: ledger record "), r.output
    assert why in r.stdout and len(r.stderr.splitlines()) == 1

    # the dead-man (root): refused like a failed undo, put back for a human, nothing ran
    lab = world.lab()
    (dm,) = deadman.expire_once(lab, now=time.time() + 1e6)
    assert "undo REFUSED: ledger record" in dm and why in dm, dm
    (kept,) = json.loads(world.ledger_text())
    assert {
        k: v for k, v in kept.items() if k not in ("deadman_retry_at", "deadman_error")
    } == record
    world.nothing_ran()

    # lab down's clear_faults: the same; lab status reports it (never hidden) without running it
    (note,) = lab.clear_faults()
    assert note.startswith("undo REFUSED: ledger record") and why in note, note
    assert len(json.loads(world.ledger_text())) == 1
    (shown,) = lab.active_faults()
    assert why in shown["refused"]
    world.nothing_ran()


def test_genuine_records_of_the_same_lab_are_undone(world: World) -> None:
    marker = world.root / "marker"
    records = [
        {
            "kind": "test-sigstop",
            "module": "chaoslib_infer.lab.testfault",
            "id": "test-sigstop-0000abcd",
            "replica": "r0",
            "pid": world.own,
            "start_time": _start(world.own),
        },
        {
            "kind": "test-marker",
            "module": "chaoslib_infer.lab.testfault",
            "id": "test-marker-0000abcd",
            "path": str(marker),
        },
    ]
    marker.write_text("test-marker-0000abcd")
    world.plant(records)
    # a reused pid (start time differs) is dropped: nothing to undo there, and no refusal; so is
    # a helper pid that is no dead-man timer at all (the timer exited, its pid was reused)
    gone = registry.validate(world.lab(), {**records[0], "start_time": "1"})
    assert gone["pid"] == 0
    freeze = {**_freeze(world), "deadman_pid": world.foreign, "pids": [world.own]}
    clean = registry.validate(world.lab(), freeze)
    assert clean["deadman_pid"] == 0 and clean["pids"] == [world.own]
    # a memory hog that has not joined its replica's cgroup yet: recognised by its command line
    r0 = json.loads((world.lab_dir / "lab.json").read_text())["replicas"][0]["cgroup"]
    for cgroup, ours in ((r0, True), (str(world.root / "elsewhere"), False)):
        hog = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"]
            + ["chaoslib_infer.lab.hog", "--cgroup", cgroup, "--version", "2"]
        )
        try:
            rec = {"kind": "oom-kill", "replica": "r0", "pid": hog.pid}
            if ours:
                assert registry.validate(world.lab(), rec)["pid"] == hog.pid
            else:
                with pytest.raises(registry.LedgerRefused, match="not a process of this lab"):
                    registry.validate(world.lab(), rec)
        finally:
            hog.kill()
            hog.wait(timeout=5)
    r = CliRunner().invoke(main, ["rollback", "--state-dir", str(world.lab_dir)])
    assert r.exit_code == 0, r.output
    assert f"SIGCONT pid {world.own}" in r.stdout and f"removed {marker}" in r.stdout
    assert json.loads(world.ledger_text()) == []
    _wait_state(world.own, "S")
    assert not marker.exists()


def test_one_tampered_record_blocks_the_whole_replay(world: World) -> None:
    """``chaos-infer rollback`` undoes nothing of a ledger with one foreign record (a human
    must look first); the dead-man still undoes the genuine record and keeps the other."""
    marker = world.root / "marker"
    marker.write_text("test-marker-0000abcd")
    genuine = {
        "kind": "test-marker",
        "module": "chaoslib_infer.lab.testfault",
        "id": "test-marker-0000abcd",
        "path": str(marker),
        "ttl_s": 1.0,
        "injected_at": 1.0,
    }
    bad = CASES["argv-rm-rf"][0](world)
    world.plant([genuine, bad])
    r = CliRunner().invoke(main, ["rollback", "--state-dir", str(world.lab_dir)])
    assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1
    assert marker.exists() and len(json.loads(world.ledger_text())) == 2
    world.nothing_ran()
    lines = deadman.expire_once(world.lab(), now=time.time() + 1e6)
    assert sorted(line.split(": ")[1] for line in lines) == [
        "test-marker test-marker-0000abcd",
        "undo REFUSED",
    ]
    assert not marker.exists()
    (left,) = json.loads(world.ledger_text())
    assert left["id"] == bad["id"]
    world.nothing_ran()


def test_only_registered_modules_are_ever_imported(world: World) -> None:
    for name in (EVIL, "os", "chaoslib_infer.cli", None, 3):
        with pytest.raises(registry.LedgerRefused, match="registry of fault modules"):
            registry.fault_module(name)
    world.nothing_ran()
    for name, kinds in registry.FAULT_MODULES.items():  # each one has the undo contract
        module = registry.fault_module(name)
        assert callable(module.undo_fault) and callable(module.fault_active), name
        assert kinds
