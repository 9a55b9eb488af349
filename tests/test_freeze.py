"""The upstream-timeout fault (:mod:`chaoslib_infer.lab.freeze`): cgroup freezer v1/v2, SIGSTOP,
the dead-man timer (also when the runner is SIGKILLed), the rollback ledger, and a real lab replica
ejected by HAProxy while frozen.

A "ticking" child process appends a line every 10 ms: frozen means its file stops growing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from chaoslib.exceptions import ActivityFailed
from labutil import lab_skip_reason
from labutil import pid_alive as _alive
from labutil import wait_for as _wait_for

from chaoslib_infer.activities import upstream
from chaoslib_infer.lab import freeze as fz
from chaoslib_infer.lab.fleet import HAPROXY_SOCK, Lab, LabError
from chaoslib_infer.lab.haproxy import show_stat

ROOT = Path(__file__).resolve().parent.parent


class Ticker:
    """A child process that appends a line to a file every 10 ms."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.out = path.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys, time\nwhile True:\n    sys.stdout.write('x\\n')\n"
                "    sys.stdout.flush()\n    time.sleep(0.01)\n",
            ],
            stdout=self.out,
        )
        _wait_for(lambda: self.lines() > 3, 5.0, "the ticker to tick")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def lines(self) -> int:
        return self.path.read_bytes().count(b"\n")

    def progress(self, during_s: float = 0.3) -> int:
        before = self.lines()
        time.sleep(during_s)
        return self.lines() - before

    def close(self) -> None:
        os.kill(self.pid, signal.SIGCONT)
        self.proc.kill()
        self.proc.wait(timeout=5)
        self.out.close()


@pytest.fixture
def ticker(tmp_path: Path) -> Iterator[Ticker]:
    t = Ticker(tmp_path / "ticks.txt")
    try:
        yield t
    finally:
        t.close()


def _name() -> str:
    return f"chaos-infer-test-{uuid.uuid4().hex[:8]}"


def _proc_cgroup(pid: int, controller: str) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        hid, ctls, path = line.split(":", 2)
        if (controller == "" and hid == "0") or controller in ctls.split(","):
            return path
    raise AssertionError(f"no {controller!r} line in /proc/{pid}/cgroup")


# --------------------------------------------------------------------------------------------
# Freezer variants on a plain process
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("freezer", ["v1", "v2"])
def test_freezer_stops_the_process_and_thaw_restores_it(ticker: Ticker, freezer: str) -> None:
    if fz.find_freezer(freezer) is None:
        pytest.skip(f"no writable {freezer} freezer hierarchy here")
    version = 1 if freezer == "v1" else 2
    home = _proc_cgroup(ticker.pid, "freezer" if version == 1 else "")
    rec = fz.prepare([ticker.pid], _name(), freezer=freezer)
    assert rec["mode"] == "freeze" and rec["freezer"] == version and rec["moved"] is True
    assert not fz.is_frozen(rec)  # prepare touches nothing
    try:
        t = fz.inject(rec)
        assert abs(t - time.time()) < 1.0
        assert fz.is_frozen(rec)
        assert ticker.progress() == 0, "a frozen process kept running"
        assert ticker.proc.poll() is None, "frozen is not dead"
        note = fz.thaw(rec)
        assert note is not None and "thawed" in note
        assert not fz.is_frozen(rec)
        assert ticker.progress() > 5, "the thawed process does not run"
        assert not Path(rec["cgroup"]).exists(), "the freezer cgroup was not removed"
        assert _proc_cgroup(ticker.pid, "freezer" if version == 1 else "") == home
        assert fz.thaw(rec) is None  # idempotent
    finally:
        fz.thaw(rec)


def test_sigstop_mode_and_fallback_without_freezer(
    ticker: Ticker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fz, "find_freezer", lambda prefer="auto": None)
    rec = fz.prepare([ticker.pid], _name(), mode="freeze")
    assert rec["mode"] == "sigstop" and rec["requested_mode"] == "freeze"
    assert "SIGSTOP" in rec["fallback_reason"]
    try:
        fz.inject(rec)
        assert fz.is_frozen(rec)
        assert Path(f"/proc/{ticker.pid}/stat").read_text().rpartition(")")[2].split()[0] == "T"
        assert ticker.progress() == 0
        assert "SIGCONT" in (fz.thaw(rec) or "")
        assert not fz.is_frozen(rec)
        assert ticker.progress() > 5
        assert fz.thaw(rec) is None
    finally:
        fz.thaw(rec)


def test_bad_mode_and_blackhole_without_nodes_are_clear_errors(ticker: Ticker) -> None:
    with pytest.raises(LabError, match="mode must be one of freeze, sigstop, blackhole"):
        fz.prepare([ticker.pid], _name(), mode="pause")
    with pytest.raises(LabError, match=r"mode 'blackhole' needs network-namespace nodes"):
        fz.prepare([ticker.pid], _name(), mode="blackhole")
    with pytest.raises(LabError, match="no running process"):
        fz.prepare([2**22 + 12345], _name())


def test_a_reused_pid_is_never_signalled(ticker: Ticker) -> None:
    rec = fz.prepare([ticker.pid], _name(), mode="sigstop")
    rec["starttimes"][str(ticker.pid)] += 1  # as if the pid now belonged to another process
    fz.inject(rec)
    assert ticker.progress() > 5
    assert not fz.is_frozen(rec)


# --------------------------------------------------------------------------------------------
# Dead-man timer
# --------------------------------------------------------------------------------------------
_RUNNER = """
import json, os, signal, sys
from chaoslib_infer.lab import freeze as fz
rec = fz.prepare([int(sys.argv[1])], sys.argv[2])
rec["deadman_pid"] = fz.spawn_deadman(rec, float(sys.argv[3]))
rec["fault_at"] = fz.inject(rec)
print(json.dumps(rec), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_deadman_thaws_after_ttl_when_the_runner_is_sigkilled(ticker: Ticker) -> None:
    ttl_s = 2.0
    runner = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(ticker.pid), _name(), str(ttl_s)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert runner.returncode == -signal.SIGKILL, runner.stderr
    rec = json.loads(runner.stdout.strip().splitlines()[-1])
    try:
        assert fz.is_frozen(rec), "the runner died before freezing"
        assert _alive(int(rec["deadman_pid"])), "no dead-man timer is running"
        assert ticker.progress(0.3) == 0
        thawed_at = _wait_for(
            lambda: None if fz.is_frozen(rec) else time.time(), ttl_s + 5.0, "the dead-man thaw"
        )
        # thawed by the timer, not earlier, and not much later than the TTL
        assert rec["fault_at"] + ttl_s - 0.05 <= thawed_at <= rec["fault_at"] + ttl_s + 2.0
        assert ticker.progress() > 5
        _wait_for(lambda: not _alive(int(rec["deadman_pid"])), 5.0, "the dead-man to exit")
        if rec.get("cgroup"):
            assert not Path(rec["cgroup"]).exists()
    finally:
        fz.thaw(rec)


def test_undo_stops_the_deadman_timer(ticker: Ticker) -> None:
    rec = fz.prepare([ticker.pid], _name())
    rec["deadman_pid"] = fz.spawn_deadman(rec, 60.0)
    try:
        fz.inject(rec)
        _wait_for(lambda: _alive(rec["deadman_pid"]), 5.0, "the dead-man to start")
        assert fz.undo_fault(None, rec) is not None  # type: ignore[arg-type]
        _wait_for(lambda: not _alive(rec["deadman_pid"]), 5.0, "the dead-man to be stopped")
        assert fz.undo_fault(None, rec) is None  # type: ignore[arg-type]
        assert ticker.progress() > 5
    finally:
        fz.thaw(rec)


# --------------------------------------------------------------------------------------------
# A real lab replica
# --------------------------------------------------------------------------------------------
@pytest.mark.lab
@pytest.mark.skipif(lab_skip_reason() is not None, reason=lab_skip_reason() or "")
def test_frozen_lab_replica_is_ejected_and_the_rollback_thaws_it(tmp_path: Path) -> None:
    lab = Lab.up(tmp_path / "lab", replicas=2, engine="sim", ready_timeout_s=60)
    cfg = {"infer_lab_dir": str(lab.state_dir), "infer_run_dir": str(tmp_path / "run")}
    try:
        port = {r["name"]: int(r["port"]) for r in lab.meta["replicas"]}
        rec = fz.freeze_replica(lab, "r0", ttl_s=60)
        active = lab.status()["active_faults"]
        assert [(f["kind"], f["replica"], f["module"]) for f in active] == [
            ("upstream-timeout", "r0", "chaoslib_infer.lab.freeze")
        ]
        assert active[0]["id"] == rec["id"] and active[0]["ttl_s"] == 60
        events = [e for e in lab.events() if e.get("event") == "fault"]
        assert events[-1]["phase"] == "injected" and events[-1]["t"] <= rec["fault_at"]
        # the socket stays open (the kernel accepts) but nothing answers
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(f"http://127.0.0.1:{port['r0']}/health", timeout=0.5)
        sock = lab.state_dir / HAPROXY_SOCK
        _wait_for(lambda: not show_stat(sock)["r0"]["status"].startswith("UP"), 6.0, "r0 ejected")
        assert time.time() - rec["fault_at"] >= 1.0  # fall 2 x inter 500ms at least
        for _ in range(4):  # the other replica carries the traffic
            resp = httpx.post(
                f"{lab.url}/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                timeout=10,
            )
            assert resp.status_code == 200 and resp.headers["x-lab-server"] == "r1"
        with pytest.raises(LabError, match="already active on r0"):
            fz.freeze_replica(lab, "r0")
        # blackhole on a loopback lab: one clear line, nothing recorded
        with pytest.raises(ActivityFailed, match=r"^mode 'blackhole' needs network-namespace"):
            upstream.freeze_replica(replica="r1", mode="blackhole", configuration=cfg)
        assert len(lab.status()["active_faults"]) == 1

        notes = upstream.thaw_replicas(cfg)  # the rollback
        assert len(notes) == 1 and "thawed" in notes[0]
        assert lab.status()["active_faults"] == []
        assert httpx.get(f"http://127.0.0.1:{port['r0']}/health", timeout=5).status_code == 200
        _wait_for(lambda: not _alive(int(rec["deadman_pid"])), 5.0, "the dead-man stopped")
        _wait_for(lambda: show_stat(sock)["r0"]["status"] == "UP", 6.0, "r0 back UP")
        assert upstream.thaw_replicas(cfg) == []  # idempotent

        # SIGSTOP variant, undone by the generic lab rollback
        rec2 = fz.freeze_replica(lab, "r1", mode="sigstop", ttl_s=60)
        assert rec2["mode"] == "sigstop"
        state = Path(f"/proc/{rec2['pid']}/stat").read_text().rpartition(")")[2].split()[0]
        assert state == "T"
        assert [f["replica"] for f in lab.status()["active_faults"]] == ["r1"]
        undone = lab.clear_faults()
        assert any("SIGCONT" in n for n in undone), undone
        assert lab.status()["active_faults"] == []
        assert httpx.get(f"http://127.0.0.1:{port['r1']}/health", timeout=5).status_code == 200
    finally:
        lab.down()


@pytest.mark.lab
@pytest.mark.skipif(lab_skip_reason() is not None, reason=lab_skip_reason() or "")
@pytest.mark.skipif(shutil.which("iptables") is None, reason="iptables not installed")
def test_blackhole_on_a_node_drops_the_replica_port_until_undone(tmp_path: Path) -> None:
    try:
        lab = Lab.up(tmp_path / "lab", replicas=2, nodes=2, spare_node=False, ready_timeout_s=60)
    except LabError as exc:  # no network namespaces here
        pytest.skip(str(exc))
    try:
        r0 = next(r for r in lab.meta["replicas"] if r["name"] == "r0")
        url = f"http://{r0['host']}:{r0['port']}/health"
        assert httpx.get(url, timeout=2).status_code == 200
        rec = fz.freeze_replica(lab, "r0", mode="blackhole", ttl_s=60)
        assert rec["mode"] == "blackhole" and rec["netns"] and rec["port"] == r0["port"]
        assert [f["kind"] for f in lab.status()["active_faults"]] == ["upstream-timeout"]
        with pytest.raises(httpx.ConnectTimeout):  # SYNs dropped: no refusal, no answer
            httpx.get(url, timeout=1.0)
        sock = lab.state_dir / HAPROXY_SOCK
        _wait_for(lambda: not show_stat(sock)["r0"]["status"].startswith("UP"), 8.0, "r0 ejected")
        assert lab.replica_pid("r0") == rec["pid"]  # the process itself is untouched
        assert any("removed DROP rule" in n for n in lab.clear_faults())
        assert lab.status()["active_faults"] == []
        assert httpx.get(url, timeout=2).status_code == 200
        assert fz.thaw(rec) is None
    finally:
        lab.down()
