"""The lab's state directory: its file names, the lab's limits, :class:`LabError`, durable writes.

A leaf module (nothing of the lab is imported here), shared by the fleet
(:mod:`chaoslib_infer.lab.fleet`), the modules that act on a running lab (nodes, scaling,
freeze, restarts) and the safety layer, so that none of them has to import the fleet for a
constant. The layout of ``state_dir`` is described in :mod:`chaoslib_infer.lab.fleet`.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from chaoslib_infer.errors import InferChaosError

__all__ = [
    "ADMIN_TOKEN_FILE",
    "DEFAULT_FAULT_TTL_S",
    "ENGINE_FAULTS_DIR",
    "FAULTS_FILE",
    "GATEWAY_FILES",
    "HAPROXY_SOCK",
    "LAB_FILE",
    "LEDGER_FILE",
    "MAX_REPLICAS",
    "MIN_MEMORY_MB",
    "REQUEST_LOG",
    "SUPERVISOR_SOCK",
    "TICK_S",
    "LabError",
    "tail",
    "write_json",
    "write_secret",
]

#: url, ports, pids, cgroup paths, engine (read by ``Lab.attach``)
LAB_FILE = "lab.json"
#: active faults: the rollback ledger (every kind, see ``Lab.add_fault``)
FAULTS_FILE = "faults.json"
#: engine ledger, shared by every replica (ground truth, sim engine)
LEDGER_FILE = "ledger.jsonl"
#: one line per request through HAProxy (ground truth, any engine)
REQUEST_LOG = "haproxy-requests.log"
#: supervisord XML-RPC (unix socket)
SUPERVISOR_SOCK = "supervisor.sock"
#: HAProxy admin stats socket
HAPROXY_SOCK = "haproxy.sock"
#: the sim engines' admin token (``--admin-token-file``; see ``Lab.admin_token``)
ADMIN_TOKEN_FILE = "admin-token"
#: the sim engines' fault-state files (``--fault-state-dir``): crash faults that survive a restart
ENGINE_FAULTS_DIR = "engine-faults"
#: replicas + standby replicas of one lab, at most
MAX_REPLICAS = 32
#: dead-man TTL of a fault record without ``ttl_s`` (seconds; see chaoslib_infer.lab.deadman)
DEFAULT_FAULT_TTL_S = 120.0
#: smallest memory limit of a replica cgroup (MiB)
MIN_MEMORY_MB = 32
#: supervisord wake-up period (seconds; see recorder.tick_forever)
TICK_S = 0.02
#: files of a non-HAProxy gateway (:mod:`chaoslib_infer.lab.gateways`), removed at lab up
GATEWAY_FILES = (
    "gateway.json", "gateway-requests.log", "gateway-servers.json", "gateway-sync.jsonl",
    "haproxy-wire.log", "nginx.conf", "nginx.conf.new", "nginx.pid", "ttft.jsonl", "litellm.yaml",
)  # fmt: skip


class LabError(InferChaosError):
    """Every expected lab failure; the message is one line."""


def tail(path: Path, lines: int = 1) -> str:
    """The last ``lines`` lines of a log file joined by `` | `` ('' when it cannot be read)."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(ln.strip() for ln in text[-lines:])


def write_json(path: Path, data: Any) -> None:
    """Durable atomic write: temporary sibling, fsync, rename, fsync of the directory.

    A reader (or a process killed mid-write) sees either the old or the new file, never half of
    one; after return the new content survives a machine crash (faults.json is the rollback ledger).

    Raises:
        OSError: the file could not be written or renamed.
    """
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(data, indent=2) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def write_secret(path: Path, value: str) -> None:
    """Write ``value`` to a new file readable by its owner only (mode 0600 from creation).

    Raises:
        FileExistsError: ``path`` exists already (it is never overwritten).
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(value + "\n")
