"""tc netem: exact argument lists (tc's grammar), kernel detection against reality, and the
network-jitter action's netem path with stand-in ``ip``/``tc`` binaries (this kernel has no netem)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from chaoslib.exceptions import ActivityFailed
from labutil import LAB_MISSING

from chaoslib_infer.lab import netem as nm


def test_add_args_exact_with_namespace_jitter_distribution_and_loss() -> None:
    assert nm.netem_add_args("veth0", 100, 20, 1, netns="node-a") == [
        "ip", "netns", "exec", "node-a",
        "tc", "qdisc", "add", "dev", "veth0", "root", "netem",
        "delay", "100ms", "20ms", "distribution", "normal", "loss", "1%",
    ]  # fmt: skip


def test_add_args_exact_host_namespace_variants() -> None:
    # delay only: no jitter, so neither distribution nor correlation (tc refuses them alone)
    assert nm.netem_add_args("eth0", 50, 0) == [
        "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "50ms",
    ]  # fmt: skip
    # correlation goes right after the jitter; fractional values keep their digits
    assert nm.netem_add_args("eth0", 400, 300, 0.5, correlation_pct=25, distribution="pareto") == [
        "tc", "qdisc", "add", "dev", "eth0", "root", "netem",
        "delay", "400ms", "300ms", "25%", "distribution", "pareto", "loss", "0.5%",
    ]  # fmt: skip
    assert nm.netem_add_args("eth0", 0.5, 0.25, distribution="uniform") == [
        "tc", "qdisc", "add", "dev", "eth0", "root", "netem",
        "delay", "0.5ms", "0.25ms", "distribution", "uniform",
    ]  # fmt: skip
    assert nm.tc_netem_args("change", "eth0", 10, 2, 3, loss_correlation_pct=50) == [
        "tc", "qdisc", "change", "dev", "eth0", "root", "netem",
        "delay", "10ms", "2ms", "distribution", "normal", "loss", "3%", "50%",
    ]  # fmt: skip


def test_del_and_show_args_exact() -> None:
    assert nm.netem_del_args("veth0", netns="n1") == [
        "ip", "netns", "exec", "n1", "tc", "qdisc", "del", "dev", "veth0", "root",
    ]  # fmt: skip
    assert nm.netem_del_args("eth0") == ["tc", "qdisc", "del", "dev", "eth0", "root"]
    assert nm.netem_show_args("eth0", "n1") == [
        "ip", "netns", "exec", "n1", "tc", "qdisc", "show", "dev", "eth0",
    ]  # fmt: skip


def test_pod_exec_uses_the_same_builder() -> None:
    spec = nm.netem_pod_exec("vllm-0", "inference", 100, 20, 1, container="netshoot")
    assert spec == {
        "name": "vllm-0",
        "namespace": "inference",
        "container": "netshoot",
        "command": nm.netem_add_args("eth0", 100, 20, 1),
    }
    undo = nm.netem_pod_exec("vllm-0", "inference", 0, 0, remove=True)
    assert undo["command"] == ["tc", "qdisc", "del", "dev", "eth0", "root"]
    assert "container" not in undo


@pytest.mark.parametrize(
    "kwargs",
    [
        {"delay_ms": -1, "jitter_ms": 0},
        {"delay_ms": 10, "jitter_ms": -1},
        {"delay_ms": 10, "jitter_ms": 1, "loss_pct": 101},
        {"delay_ms": 10, "jitter_ms": 1, "distribution": "gamma"},
        {"delay_ms": 10, "jitter_ms": 0, "correlation_pct": 10},
        {"delay_ms": float("inf"), "jitter_ms": 0},
    ],
)
def test_bad_arguments_raise(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        nm.netem_add_args("eth0", **kwargs)


@pytest.mark.parametrize("dev", ["", "eth 0", "a/b", "x" * 16])
def test_bad_device_names_raise(dev: str) -> None:
    with pytest.raises(ValueError, match="device"):
        nm.netem_del_args(dev)
    with pytest.raises(ValueError, match="namespace"):
        nm.netem_del_args("eth0", netns="bad ns")


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("tc"), reason=LAB_MISSING + "needs root and tc"
)
def test_detection_matches_what_the_kernel_does() -> None:
    """netem_available() must agree with a real ``tc qdisc add ... netem`` in a namespace we make."""
    ns = f"cinf-test-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(
            ["ip", "-n", ns, "link", "add", "t0", "type", "veth", "peer", "name", "t1"], check=True
        )
        real = subprocess.run(
            nm.netem_add_args("t0", 5, 1, netns=ns), capture_output=True, text=True
        )
        control = subprocess.run(  # tbf works here: the namespace and tc themselves are fine
            ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "t0", "root", "tbf",
             "rate", "1mbit", "burst", "32kbit", "latency", "400ms"],
            capture_output=True, text=True,
        )  # fmt: skip
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    assert control.returncode == 0, control.stderr
    ok, why = nm.netem_probe(refresh=True)
    assert ok == (real.returncode == 0)
    assert nm.netem_available() is ok
    # on this project's reference kernel netem is missing; the reason is tc's own words
    if real.returncode != 0:
        assert "unknown" in why.lower() or "refused" in why.lower(), why
    assert (
        f"cinf-netem-probe-{os.getpid()}"
        not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    )  # the probe cleaned up after itself


# --------------------------------------------------------------------------------------------
# The action's netem path, with stand-ins for ip and tc (runs everywhere, touches no kernel state)
# --------------------------------------------------------------------------------------------
_FAKE_TC = """#!/bin/sh
[ -z "$CHAOS_INFER_API_KEY" ] || echo "tc saw the API key" >> "$FAKE_NET_LOG"
echo "tc $*" >> "$FAKE_NET_LOG"
case "$1 $2" in
  "qdisc add") touch "$FAKE_NET_STATE.$4" ;;
  "qdisc del") rm -f "$FAKE_NET_STATE.$4" ;;
  "qdisc show") if [ -e "$FAKE_NET_STATE.$4" ]; then echo "qdisc netem 8001: root"; else echo "qdisc noqueue 0: root"; fi ;;
  "-s qdisc") if [ -e "$FAKE_NET_STATE.$5" ]; then printf 'qdisc netem 8001: root\n Sent 4200 bytes 42 pkt (dropped 0, overlimits 0 requeues 0)\n'; fi ;;
esac
"""
_FAKE_IP = """#!/bin/sh
[ -z "$CHAOS_INFER_API_KEY" ] || echo "ip saw the API key" >> "$FAKE_NET_LOG"
if [ "$1" = netns ] && [ "$2" = exec ]; then
  echo "ip netns exec $3" >> "$FAKE_NET_LOG"
  shift 3
  exec "$@"
fi
exit 1
"""


_KEY = "sk-netem-0123456789abcdef"


def _fake_lab(tmp_path: Path) -> Path:
    lab_dir = tmp_path / "lab"
    lab_dir.mkdir()
    meta = {
        "lab_id": "t1",
        "state_dir": str(lab_dir),
        "url": "http://127.0.0.1:1",
        "port": 1,
        "engine": "sim",
        "replicas": [
            {"name": "r0", "port": 2, "cgroup": "/nonexistent", "node": "n0"},
            {"name": "r1", "port": 3, "cgroup": "/nonexistent", "node": "n1"},
        ],
        "nodes": [
            {"name": "n0", "ns": "chaosinfer-t1-n0", "veth_root": "cit1r0", "veth_node": "cit1n0"},
            {"name": "n1", "ns": "chaosinfer-t1-n1", "veth_root": "cit1r1", "veth_node": "cit1n1"},
        ],
        "pids": {},
    }
    (lab_dir / "lab.json").write_text(json.dumps(meta))
    # r0 was rescheduled onto node n1: the placement wins over the replica's initial node
    (lab_dir / "placement.json").write_text(json.dumps({"replicas": {"r0": {"node": "n1"}}}))
    return lab_dir


def test_netem_path_with_nodes_adds_and_removes_qdiscs_on_both_veth_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chaoslib_infer.drills.network_jitter import actions as network
    from chaoslib_infer.drills.network_jitter import plumbing
    from chaoslib_infer.lab.fleet import Lab

    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in (("tc", _FAKE_TC), ("ip", _FAKE_IP)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    log = tmp_path / "net.log"
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NET_LOG", str(log))
    monkeypatch.setenv("FAKE_NET_STATE", str(tmp_path / "qdisc"))
    monkeypatch.setenv("CHAOS_INFER_API_KEY", _KEY)  # tc, ip and the watchdog never get it
    monkeypatch.setattr(nm, "netem_probe", lambda refresh=False: (True, "stand-in"))
    monkeypatch.setattr(network, "_active_on", lambda lab, name: None)
    lab_dir = _fake_lab(tmp_path)
    cfg = {"infer_lab_dir": str(lab_dir), "infer_run_dir": str(tmp_path / "run")}

    entry = network.inject_network_jitter(
        replica="r0", delay_ms=100, jitter_ms=20, loss_pct=1, duration_s=5, configuration=cfg
    )
    assert entry["mechanism"] == "netem"
    assert entry["links"] == [[None, "cit1r1"], ["chaosinfer-t1-n1", "cit1n1"]]
    lines = log.read_text().splitlines()
    assert lines == [
        "tc qdisc add dev cit1r1 root netem delay 100ms 20ms distribution normal loss 1%",
        "ip netns exec chaosinfer-t1-n1",
        "tc qdisc add dev cit1n1 root netem delay 100ms 20ms distribution normal loss 1%",
    ]
    lab = Lab.attach(lab_dir)
    faults = json.loads((lab_dir / "faults.json").read_text())
    assert [f["kind"] for f in faults] == ["network-jitter"]
    assert network.fault_active(lab, faults[0]) is True
    assert plumbing.netem_present(faults[0]) is True
    watchdog = int(faults[0]["watchdog_pid"])
    assert plumbing.is_our_process(watchdog, entry["token"], "sleep")
    environ = Path(f"/proc/{watchdog}/environ").read_bytes().split(b"\0")
    assert not [v for v in environ if v.startswith(b"CHAOS_INFER_API_KEY=") or _KEY.encode() in v]
    assert f"FAKE_NET_LOG={log}".encode() in environ  # the rest of the environment is kept

    removed = network.remove_network_jitter(configuration=cfg)
    assert "removed netem from cit1r1, cit1n1" in str(removed["undone"])
    assert "stopped its watchdog" in str(removed["undone"])
    # the qdiscs' counters, read before their removal: the delay the kernel applied
    assert removed["netem"] == {"bytes": 8400, "packets": 84}
    dels = [ln for ln in log.read_text().splitlines() if "qdisc del" in ln]
    assert dels == ["tc qdisc del dev cit1r1 root", "tc qdisc del dev cit1n1 root"]
    assert "saw the API key" not in log.read_text()  # show/del calls too
    assert plumbing.netem_present(faults[0]) is False
    assert network.fault_active(lab, faults[0]) is False
    assert json.loads((lab_dir / "faults.json").read_text()) == []
    deadline = time.monotonic() + 3
    while plumbing.pid_alive(watchdog) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not plumbing.pid_alive(watchdog)
    events = [json.loads(x) for x in (lab_dir / "events.jsonl").read_text().splitlines()]
    phases = [e["phase"] for e in events if e.get("event") == "network-jitter"]
    assert phases == ["applied", "removed"]
    # undo is idempotent
    assert network.undo_fault(lab, faults[0]) is None


def test_netem_requested_on_this_kernel_fails_with_one_clear_line(tmp_path: Path) -> None:
    from chaoslib_infer.drills.network_jitter import actions as network

    if nm.netem_available():
        pytest.skip("this kernel has netem")
    lab_dir = _fake_lab(tmp_path)
    cfg = {"infer_lab_dir": str(lab_dir), "infer_run_dir": str(tmp_path / "run")}
    with pytest.raises(ActivityFailed, match="netem unavailable") as err:
        network.inject_network_jitter(replica="r0", mechanism="netem", configuration=cfg)
    assert "\n" not in str(err.value)
    assert not (lab_dir / "faults.json").exists()
