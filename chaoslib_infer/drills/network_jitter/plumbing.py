"""The network-jitter drill's process and link plumbing: the processes a fault starts (the shim,
the netem dead-man watchdog) and how they are told apart and stopped, the devices that carry a
replica's traffic, the ``tc`` argv rebuilt from a fault record, and the shim's start.

Split out of :mod:`chaoslib_infer.drills.network_jitter.actions` (issue 12), which re-exports its
constants.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaoslib.exceptions import ActivityFailed

from chaoslib_infer.lab import netem as nm
from chaoslib_infer.lab import processes, procfs
from chaoslib_infer.lab.fleet import Lab, LabError
from chaoslib_infer.lab.recorder import EVENTS_FILE
from chaoslib_infer.lab.shim import SHIM_MODULE
from chaoslib_infer.safety.redact import child_env

__all__ = [
    "BACKEND",
    "CHILDREN",
    "HAPROXY_SOCK",
    "PACKAGE_PARENT",
    "SHIM_START_TIMEOUT_S",
    "Link",
    "is_our_process",
    "netem_present",
    "pid_alive",
    "replica_links",
    "run_tc",
    "signal_process",
    "start_shim",
    "stop_process",
    "tc_argv",
]

BACKEND = "engines"
HAPROXY_SOCK = "haproxy.sock"
SHIM_START_TIMEOUT_S = 10.0
PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])
#: Shim processes started by this process (reaped on undo; keeps Popen from warning at exit).
CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie (our own zombies are reaped)."""
    if pid <= 0:
        return False
    proc = CHILDREN.get(pid)
    if proc is not None and proc.poll() is not None:
        CHILDREN.pop(pid, None)
        return False
    return processes.alive(pid)


def is_our_process(pid: int, token: str, marker: str) -> bool:
    """``pid`` runs and its command line carries both ``marker`` and this fault's ``token``."""
    if not pid or not pid_alive(pid):
        return False
    cmd = procfs.cmdline(pid)
    return marker in cmd and bool(token) and token in cmd


def signal_process(pid: int, sig: int) -> None:
    """Signal ``pid``, and its process group when it leads one (started with a new session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
            return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def stop_process(pid: int, token: str, marker: str, grace_s: float) -> bool:
    """SIGTERM, wait ``grace_s``, SIGKILL. Only a process of this fault. Returns True if stopped."""
    if not is_our_process(pid, token, marker):
        return False
    signal_process(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if pid_alive(pid):
        signal_process(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
    proc = CHILDREN.pop(pid, None)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
    return True


Link = tuple[str | None, str]


def replica_links(lab: Lab, replica: str) -> list[Link]:
    """The ``(netns, dev)`` devices that carry ``replica``'s traffic, for netem; [] on loopback.

    - A replica entry in ``lab.json`` with ``dev`` (and ``netns``): that device.
    - A lab with network-namespace nodes (``lab.json`` ``nodes``: ``name``, ``ns``, ``veth_root``,
      ``veth_node``; the replica's current node from ``placement.json``, else its ``node`` key):
      both ends of the node's veth pair, the root side (egress: requests to the node) and the
      node side inside its namespace (egress: responses), so both directions are delayed as the
      shim delays both. Every replica on that node shares the link.
    """
    rep = next((r for r in lab.meta.get("replicas", []) if r.get("name") == replica), None)
    if rep is None:
        return []
    dev = rep.get("dev") or rep.get("link_dev")
    if dev:
        return [(str(rep["netns"]) if rep.get("netns") else None, str(dev))]
    nodes = lab.meta.get("nodes") or []
    if not nodes:
        return []
    node = rep.get("node")
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        placement = json.loads((lab.state_dir / "placement.json").read_text())
        node = placement["replicas"][replica].get("node") or node
    for n in nodes:
        if n.get("name") == node and n.get("ns") and n.get("veth_node") and n.get("veth_root"):
            return [(None, str(n["veth_root"])), (str(n["ns"]), str(n["veth_node"]))]
    return []


def tc_argv(record: dict[str, Any], what: str) -> list[list[str]]:
    """The ``tc qdisc show`` / ``del`` argv of every link of ``record``, rebuilt from its
    ``links`` (``[[netns or None, device], ...]``) by :mod:`chaoslib_infer.lab.netem`: a stored
    argv is never run (the ledger is data; see :mod:`chaoslib_infer.lab.registry`).

    Raises:
        LabError: a bad device or namespace name.
    """
    build = nm.netem_show_args if what == "show" else nm.netem_del_args
    try:
        return [build(str(dev), ns) for ns, dev in record.get("links") or []]
    except (ValueError, TypeError) as exc:
        raise LabError(f"network-jitter record {record.get('id')}: {exc}") from None


def run_tc(args: Sequence[str], timeout_s: float = 5.0) -> subprocess.CompletedProcess[str]:
    """Run one ``tc`` argv (text output, exit status not checked), its environment without the
    API key (``child_env``).

    Raises:
        OSError: ``tc`` cannot be started. subprocess.TimeoutExpired: it ran past ``timeout_s``.
    """
    return subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout_s, check=False, env=child_env()
    )


#: ``tc -s qdisc show``'s counters line of a qdisc: " Sent 1234 bytes 56 pkt (dropped 0, ..."
_SENT = re.compile(r"Sent (\d+) bytes (\d+) pkt")


def parse_netem_counters(text: str) -> dict[str, int] | None:
    """``{"bytes", "packets"}`` sent through the netem qdiscs of ``tc -s qdisc show`` output
    (each ``qdisc netem`` line followed by its ``Sent N bytes M pkt`` line), or None when no
    netem qdisc is listed."""
    total: dict[str, int] | None = None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("qdisc netem"):
            continue
        for nxt in lines[i + 1 : i + 3]:
            m = _SENT.search(nxt)
            if m:
                total = total or {"bytes": 0, "packets": 0}
                total["bytes"] += int(m.group(1))
                total["packets"] += int(m.group(2))
                break
    return total


def netem_counters(record: dict[str, Any]) -> dict[str, int] | None:
    """What went through the fault's netem qdiscs so far (``tc -s qdisc show`` on each link:
    the delay the kernel applied to the replica's packets), read before they are deleted; None
    when tc cannot say (the verdict then relies on the traffic alone)."""
    out: dict[str, int] | None = None
    try:
        argvs = tc_argv(record, "show")
    except LabError:
        return None
    for args in argvs:
        at = args.index("tc") + 1
        try:
            done = run_tc([*args[:at], "-s", *args[at:]])
        except (OSError, subprocess.TimeoutExpired):
            return None
        got = parse_netem_counters(done.stdout) if done.returncode == 0 else None
        if got is not None:
            out = out or {"bytes": 0, "packets": 0}
            out = {k: out[k] + got[k] for k in out}
    return out


def netem_present(record: dict[str, Any]) -> bool:
    """True while ``tc qdisc show`` lists a netem qdisc on any of the fault's devices (an
    unanswered query counts as present: never hide a fault)."""
    for args in tc_argv(record, "show"):
        try:
            out = run_tc(args)
        except (OSError, subprocess.TimeoutExpired):
            return True
        if out.returncode != 0 and "Cannot find device" not in out.stderr:
            return True
        if "netem" in out.stdout:
            return True
    return False


def start_shim(
    lab: Lab,
    replica: str,
    upstream: tuple[str, int],
    token: str,
    delay_ms: float,
    jitter_ms: float,
    loss_pct: float,
    distribution: str,
    seed: int | None,
    ttl_s: float,
    drain_s: float,
) -> tuple[subprocess.Popen[bytes], int, Path]:
    logs = lab.state_dir / "logs"
    logs.mkdir(exist_ok=True)
    stats = logs / f"shim-{replica}-{token}.json"
    cmd = [
        sys.executable,
        "-m",
        SHIM_MODULE,
        "--upstream",
        f"{upstream[0]}:{upstream[1]}",
        "--delay-ms",
        f"{delay_ms:g}",
        "--jitter-ms",
        f"{jitter_ms:g}",
        "--loss-pct",
        f"{loss_pct:g}",
        "--distribution",
        distribution,
        "--ttl-s",
        f"{ttl_s:g}",
        "--drain-s",
        f"{drain_s:g}",
        "--stats",
        str(stats),
        "--events",
        str(lab.state_dir / EVENTS_FILE),
        "--haproxy-sock",
        str(lab.state_dir / HAPROXY_SOCK),
        "--server",
        f"{BACKEND}/{replica}",
        "--detour",
        f"{replica}-jitter",
        "--label",
        token,
    ]
    if seed is not None:
        cmd += ["--seed", str(int(seed))]
    env = child_env()  # lab children never get the API key
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_PARENT, *filter(None, [env.get("PYTHONPATH")])])
    with open(logs / f"shim-{replica}.log", "ab") as err:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
            start_new_session=True,
        )
    CHILDREN[proc.pid] = proc
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], SHIM_START_TIMEOUT_S)
    line = proc.stdout.readline().decode(errors="replace").split() if ready else []
    proc.stdout.close()
    if len(line) < 2 or line[0] != "listening":
        stop_process(proc.pid, token, SHIM_MODULE, 1.0)
        tail = (logs / f"shim-{replica}.log").read_text(errors="replace").strip().splitlines()
        raise ActivityFailed(
            f"jitter shim for {replica} did not start: {tail[-1] if tail else 'no output'}"
        )
    return proc, int(line[1]), stats
