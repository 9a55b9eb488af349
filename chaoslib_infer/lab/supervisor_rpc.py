"""supervisord's XML-RPC interface over the lab's unix socket (``state_dir/supervisor.sock``).

A leaf module: the fleet, nodes, scaling and restarts call supervisord through :func:`rpc`.
The methods are supervisord's own (``supervisor.getAllProcessInfo``, ``startProcess``,
``stopProcess``, ``shutdown``; see supervisord's XML-RPC API documentation).
"""

from __future__ import annotations

import http.client
import socket
import xmlrpc.client
from pathlib import Path
from typing import Any

from chaoslib_infer.lab.statedir import SUPERVISOR_SOCK

__all__ = ["ALREADY_STARTED", "RPC_ERRORS", "rpc", "start_process"]

#: what a call through :func:`rpc` raises when supervisord is gone or refuses
RPC_ERRORS = (OSError, xmlrpc.client.Error, http.client.HTTPException)
#: supervisord's fault code for ``startProcess`` on a process that is RUNNING, STARTING or in
#: BACKOFF (``supervisor.xmlrpc.Faults.ALREADY_STARTED``)
ALREADY_STARTED = 60


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class _UnixTransport(xmlrpc.client.Transport):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__()
        self._path = path
        self._timeout = timeout

    def make_connection(self, host: Any) -> http.client.HTTPConnection:
        return _UnixHTTPConnection(self._path, self._timeout)


def rpc(state_dir: Path, timeout_s: float = 5.0) -> Any:
    """supervisord XML-RPC proxy over the lab's unix socket (each call times out after
    ``timeout_s`` seconds and raises one of :data:`RPC_ERRORS`)."""
    transport = _UnixTransport(str(state_dir / SUPERVISOR_SOCK), timeout_s)
    return xmlrpc.client.ServerProxy("http://localhost/RPC2", transport=transport)


def start_process(state_dir: Path, name: str, timeout_s: float = 5.0) -> bool:
    """Ask supervisord to start program ``name`` without waiting for it (``startProcess(name,
    False)``).

    Returns:
        True when supervisord started it; False when it was already running or starting
        (``ALREADY_STARTED``: e.g. supervisord's own ``autorestart`` respawned a killed engine
        between the caller's state read and this call, a race that widens on a loaded machine).

    Raises:
        OSError, http.client.HTTPException: supervisord not answering (see :data:`RPC_ERRORS`).
        xmlrpc.client.Fault: any other refusal (unknown name, spawn error).
    """
    try:
        rpc(state_dir, timeout_s).supervisor.startProcess(name, False)
    except xmlrpc.client.Fault as exc:
        if exc.faultCode == ALREADY_STARTED:
            return False
        raise
    return True
