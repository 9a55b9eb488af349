"""Lab nodes: replicas in network namespaces, node loss, rescheduling onto the spare node.

Tests marked ``lab`` create real network namespaces and veth pairs (root), run supervisord, HAProxy
and simulated engines, and check that nothing is left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from labutil import LAB_MISSING, lab_skip_reason
from labutil import pid_alive as _alive
from labutil import wait_for as _wait_for

from chaoslib_infer.lab import netns, nodes
from chaoslib_infer.lab.fleet import Lab, LabError
from chaoslib_infer.lab.haproxy import stats_command

ROOT = Path(__file__).resolve().parent.parent


def _lab_available() -> str | None:
    reason = lab_skip_reason()
    if reason is not None:
        return reason
    try:
        netns.find_ip()
    except netns.NetnsError as exc:
        return LAB_MISSING + str(exc)
    if os.geteuid() != 0:
        return LAB_MISSING + "network namespaces need root"
    return None


_SKIP = _lab_available()
needs_lab = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")


def _netns_inode(ns: str) -> int:
    return os.stat(f"/run/netns/{ns}").st_ino


def _pid_netns_inode(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def _leftovers(lab_id: str) -> dict[str, Any]:
    """Namespaces, links and routes of this lab still present on the machine."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
    # guard routes of other labs alive on this machine (their veths route inside the same /24)
    others = {
        ln.split()[0].rsplit(".", 1)[0]
        for ln in routes.splitlines()
        if " dev ci" in ln and f"ci{lab_id}" not in ln
    }
    return {
        "netns": netns.list_namespaces(f"{netns.NS_PREFIX}-{lab_id}-"),
        "links": [ln for ln in links.splitlines() if f"ci{lab_id}" in ln],
        "routes": [
            ln
            for ln in routes.splitlines()
            if "10.213." in ln and "4242" in ln and ln.split()[1].rsplit(".", 1)[0] not in others
        ],
    }


def _chat(url: str, rid: str, timeout_s: float = 10.0) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers={"X-Request-Id": rid},
        timeout=timeout_s,
    )


def _server_addrs(lab: Lab) -> dict[str, str]:
    """``{server: "ip:port"}`` from HAProxy's runtime ``show servers conn``."""
    text = stats_command(lab.state_dir / "haproxy.sock", "show servers conn engines")
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0].startswith("engines/"):
            out[parts[0].split("/", 1)[1]] = f"{parts[2]}:{parts[3]}"
    return out


@pytest.fixture()
def node_lab(tmp_path: Path) -> Iterator[Lab]:
    """Three sim replicas on two nodes (n0: r0, r2; n1: r1) plus the spare node n2."""
    lab = Lab.up(tmp_path / "lab", replicas=3, nodes=2, engine_args={"load_delay_s": 0.3})
    try:
        yield lab
    finally:
        lab_id = lab.meta["lab_id"]
        lab.down()
        assert _leftovers(lab_id) == {"netns": [], "links": [], "routes": []}


# --------------------------------------------------------------------------------------------
# No processes
# --------------------------------------------------------------------------------------------
def test_validate_nodes_options() -> None:
    argv = ["python", "-m", "x", "--host", "127.0.0.1", "--port", "1"]
    assert nodes.validate_nodes(None, None, argv) == (0, False)
    assert nodes.validate_nodes(0, True, argv) == (0, False)
    assert nodes.validate_nodes(3, None, argv) == (3, True)
    assert nodes.validate_nodes(2, False, argv) == (2, False)
    for bad in (-1, 17, True, "3"):
        with pytest.raises(LabError, match="nodes must be between 0 and 16"):
            nodes.validate_nodes(bad, None, argv)  # type: ignore[arg-type]
    with pytest.raises(LabError, match="spare_node must be true or false"):
        nodes.validate_nodes(2, "yes", argv)  # type: ignore[arg-type]
    with pytest.raises(LabError, match="no --host argument"):
        nodes.validate_nodes(2, None, ["engine", "--port", "1"])


def test_rehost_argv_and_haproxy_config() -> None:
    assert netns.rehost_argv(["e", "--host", "127.0.0.1", "--port", "9"], "10.213.1.2") == [
        "e",
        "--host",
        "10.213.1.2",
        "--port",
        "9",
    ]
    assert netns.rehost_argv(["e", "--host=127.0.0.1"], "10.213.1.2") == ["e", "--host=10.213.1.2"]
    assert netns.node_addresses(7, 0) == ("10.213.7.1", "10.213.7.2")
    assert netns.node_addresses(7, 3) == ("10.213.7.13", "10.213.7.14")
    root, node = netns.veth_names("0123abcd", 16)
    assert len(root) <= 15 and len(node) <= 15 and root != node
    cfg = (
        "backend engines\n    server r0 127.0.0.1:4000 check\n    server r10 127.0.0.1:4010 check\n"
    )
    out = nodes.haproxy_config(cfg, {"r0": ("10.213.7.2", 4000), "r10": ("10.213.7.6", 4010)})
    assert "    server r0 10.213.7.2:4000 check\n" in out
    assert "    server r10 10.213.7.6:4010 check\n" in out
    with pytest.raises(LabError, match="0 server lines for r3"):
        nodes.haproxy_config(cfg, {"r3": ("10.213.7.2", 1)})
    # a LiteLLM lab: the replica's lane has its server line too, moved with it
    lanes = cfg + "\nbackend lane_r0\n    server r0 127.0.0.1:4000\n"
    out = nodes.haproxy_config(lanes, {"r0": ("10.213.7.14", 4000)})
    assert out.count("server r0 10.213.7.14:4000") == 2
    with pytest.raises(LabError, match="2 server lines for r10, expected 1"):
        nodes.haproxy_config(cfg + "    server r10 127.0.0.1:1\n", {"r10": ("10.213.7.6", 1)})


def test_missing_ip_is_a_clear_lab_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns, "IP_CANDIDATES", ())
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LabError, match=r"^`ip` \(iproute2\) not found: lab nodes need it"):
        Lab.up(tmp_path / "lab", replicas=1, nodes=1)
    assert not (tmp_path / "lab" / "lab.json").exists()


def test_lose_node_needs_a_lab_with_nodes(tmp_path: Path) -> None:
    lab = Lab(tmp_path, {"nodes": [], "replicas": [], "state_dir": str(tmp_path)})
    with pytest.raises(LabError, match="the lab has no nodes; bring it up with nodes >= 1"):
        nodes.lose_node(lab)


# --------------------------------------------------------------------------------------------
# Real namespaces
# --------------------------------------------------------------------------------------------
@pytest.mark.lab
@needs_lab
def test_namespace_creation_not_permitted_is_a_clear_error(tmp_path: Path) -> None:
    """Without CAP_SYS_ADMIN (dropped from the bounding set) ``lab up --nodes`` fails in one line
    and leaves nothing behind."""
    proc = subprocess.run(
        [
            "setpriv",
            "--bounding-set=-sys_admin",
            "--",
            sys.executable,
            "-m",
            "chaoslib_infer.cli",
            "lab",
            "up",
            "--nodes",
            "1",
            "--replicas",
            "1",
            "--port",
            "0",
            "--state-dir",
            str(tmp_path / "lab"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert err.startswith("chaos-infer: error: cannot create network namespace chaosinfer-"), err
    assert "lab nodes need root" in err and "\n" not in err
    lab_id = json.loads((tmp_path / "lab" / "lab.json").read_text())["lab_id"]
    assert _leftovers(lab_id) == {"netns": [], "links": [], "routes": []}


@pytest.mark.lab
@needs_lab
def test_cli_lab_with_nodes_serves_across_namespaces_and_leaves_nothing(tmp_path: Path) -> None:
    state = tmp_path / "lab"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "chaoslib_infer.cli", "lab", *args, "--state-dir", str(state)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )

    up = cli("up", "--replicas", "3", "--nodes", "2", "--port", "0")
    assert up.returncode == 0, up.stdout + up.stderr
    lab = Lab.attach(state)
    lab_id = lab.meta["lab_id"]
    try:
        status = json.loads(cli("status", "--json").stdout)
        by_node = {n["name"]: n for n in status["nodes"]}
        assert {k: v["replicas"] for k, v in by_node.items()} == {
            "n0": ["r0", "r2"],
            "n1": ["r1"],
            "n2": [],
        }
        assert [n["spare"] for n in status["nodes"]] == [False, False, True]
        assert all(n["up"] for n in status["nodes"])
        assert sorted(netns.list_namespaces(f"chaosinfer-{lab_id}-")) == [
            f"chaosinfer-{lab_id}-n0",
            f"chaosinfer-{lab_id}-n1",
            f"chaosinfer-{lab_id}-n2",
        ]
        addrs = _server_addrs(lab)
        for rep in status["replicas"]:
            node = by_node[{"r0": "n0", "r1": "n1", "r2": "n0"}[rep["name"]]]
            assert rep["host"] == node["ip"] and rep["healthy"] is True
            assert rep["haproxy_status"] == "UP"
            # the engine process lives in its node's namespace and HAProxy dials the node address
            assert _pid_netns_inode(rep["pid"]) == _netns_inode(node["ns"])
            assert _pid_netns_inode(rep["pid"]) != _pid_netns_inode(os.getpid())
            assert addrs[rep["name"]] == f"{node['ip']}:{rep['port']}"
            # nothing listens on the root namespace's loopback for it
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"http://127.0.0.1:{rep['port']}/health", timeout=1.0)
        served = {_chat(lab.url, f"c{i}").headers["x-replica-id"] for i in range(15)}
        assert served == {"r0", "r1", "r2"}
        pids = [r["pid"] for r in status["replicas"]] + [status["supervisord_pid"]]
    finally:
        down = cli("down")
    assert down.returncode == 0, down.stderr
    assert _leftovers(lab_id) == {"netns": [], "links": [], "routes": []}
    assert not (state / netns.PLACEMENT_FILE).exists()
    assert [p for p in pids if _alive(int(p))] == []


@pytest.mark.lab
@needs_lab
def test_lose_node_reschedules_onto_spare_and_rollback_makes_lab_whole(
    node_lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    lab = node_lab
    spare = lab.status()["nodes"][2]
    pids = {n: lab.replica_pid(n) for n in ("r0", "r2")}
    # an injection that fails after the freeze (the link cannot be cut) is undone: the frozen
    # replicas are thawed, not left stopped (state T) behind a node that looks up
    real_set_link = netns.set_link

    def no_cut(ns: str, dev: str, up: bool) -> None:
        if not up:
            raise netns.NetnsError("cannot cut (test)")
        real_set_link(ns, dev, up)

    monkeypatch.setattr(netns, "set_link", no_cut)
    with pytest.raises(LabError, match="failed and was undone"):
        lab.lose_node("auto", down_s=30, reschedule_after_s=0.5)
    monkeypatch.setattr(netns, "set_link", real_set_link)
    assert lab.status()["active_faults"] == []
    for pid in pids.values():
        assert pid and _alive(pid)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        assert state != "T", (pid, state)
    assert _chat(lab.url, "after-failed-injection").status_code == 200
    result = lab.lose_node("auto", down_s=30, reschedule_after_s=0.5)
    assert result["node"] == "n0" and result["replicas"] == ["r0", "r2"]
    assert result["spare"] == "n2"
    assert result["killed_at"] - result["fault_at"] < 1.0
    for pid in pids.values():
        assert pid and not _alive(pid)
    status = lab.status()
    assert [f["kind"] for f in status["active_faults"]] == ["node-loss"]
    assert next(n for n in status["nodes"] if n["name"] == "n0")["up"] is False
    # the spare node takes both lost replicas, at its address, in HAProxy too
    _wait_for(
        lambda: (
            {
                r["name"]: (r["state"], r["host"], r["healthy"], r["haproxy_status"])
                for r in lab.status()["replicas"]
                if r["name"] in ("r0", "r2")
            }
            == {n: ("RUNNING", spare["ip"], True, "UP") for n in ("r0", "r2")}
        ),
        20,
        "r0 and r2 running and UP on the spare node",
    )
    addrs = _server_addrs(lab)
    assert addrs["r0"].startswith(spare["ip"] + ":") and addrs["r2"].startswith(spare["ip"] + ":")
    assert f"server r0 {spare['ip']}:" in (lab.state_dir / "haproxy.cfg").read_text()
    for name in ("r0", "r2"):
        assert _pid_netns_inode(int(lab.replica_pid(name) or 0)) == _netns_inode(spare["ns"])
    served = {_chat(lab.url, f"after-{i}").headers["x-replica-id"] for i in range(20)}
    assert {"r0", "r2"} <= served
    events = lab.events()
    mine = [e for e in events if e.get("fault_id") == result["fault_id"]]
    assert [e["event"] for e in mine][:2] == ["fault", "node_down"]
    assert mine[1]["t"] == result["fault_at"] and mine[1]["replicas"] == ["r0", "r2"]
    moves = [e for e in events if e.get("event") == "rescheduled"]
    assert {(e["replica"], e["from_node"], e["to_node"]) for e in moves} == {
        ("r0", "n0", "n2"),
        ("r2", "n0", "n2"),
    }
    assert all(e["t"] - result["fault_at"] >= 0.5 for e in moves)
    _wait_for(
        lambda: {e["replica"] for e in lab.events() if e.get("event") == "serving"} == {"r0", "r2"},
        10,
        "serving events at the new place",
    )
    exits = [e for e in events if e.get("event") == "exit" and e.get("pid") in pids.values()]
    assert {e["status"] for e in exits} == {"signal:SIGKILL"}
    # the rollback: node back (empty), nothing active, controller gone
    notes = lab.clear_faults()
    assert any("node n0 network restored" in n for n in notes), notes
    status = lab.status()
    assert status["active_faults"] == []
    assert {n["name"]: (n["up"], n["replicas"]) for n in status["nodes"]} == {
        "n0": (True, []),
        "n1": (True, ["r1"]),
        "n2": (True, ["r0", "r2"]),
    }
    assert not _alive(result["controller_pid"])
    ups = [e for e in lab.events() if e.get("event") == "node_up"]
    assert [(e["node"], e["by"]) for e in ups] == [("n0", "rollback")]
    lab.wait_healthy(10)


@pytest.mark.lab
@needs_lab
def test_dead_man_brings_the_node_back_when_the_runner_dies(tmp_path: Path) -> None:
    """No spare node: the lost replica cannot move (``reschedule_blocked``); the runner that lost
    the node is SIGKILLed; the node controller still brings the node back after ``down_s`` and the
    replica serves again on its own node."""
    lab = Lab.up(
        tmp_path / "lab", replicas=2, nodes=2, spare_node=False, engine_args={"load_delay_s": 0.3}
    )
    lab_id = lab.meta["lab_id"]
    try:
        code = (
            "import os, signal, sys\n"
            "from chaoslib_infer.lab.fleet import Lab\n"
            f"r = Lab.attach({str(lab.state_dir)!r}).lose_node('n0', 2.0, 0.3)\n"
            "print(r['fault_at'], flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n"
        )
        runner = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
        )
        assert runner.returncode == -9, runner.stderr
        fault_at = float(runner.stdout.split()[0])
        assert lab.status()["nodes"][0]["up"] is False
        up = _wait_for(
            lambda: next((e for e in lab.events() if e.get("event") == "node_up"), None),
            10,
            "node_up from the dead-man timer",
        )
        assert up["by"] == "dead-man timer"
        assert 2.0 <= up["t"] - fault_at < 2.5
        blocked = [e for e in lab.events() if e.get("event") == "reschedule_blocked"]
        assert [(e["node"], e["replicas"]) for e in blocked] == [("n0", ["r0"])]
        assert 0.3 <= blocked[0]["t"] - fault_at < 1.0
        assert not [e for e in lab.events() if e.get("event") == "rescheduled"]

        def r0_serves() -> float | None:
            _chat(lab.url, f"back-{time.monotonic_ns()}")  # traffic, so that r0 gets some
            return lab.served("r0", after=up["t"])

        _wait_for(r0_serves, 15, "r0 serving on n0 again")
        assert lab.status()["active_faults"] == []
        assert lab.replica_host("r0") == lab.meta["nodes"][0]["ip"]
        lab.wait_healthy(10)
        notes = lab.clear_faults()  # the record is still in the ledger: nothing left to undo
        assert len(notes) == 1 and notes[0].endswith("nothing left to undo"), notes
    finally:
        lab.down()
    assert _leftovers(lab_id) == {"netns": [], "links": [], "routes": []}
