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

__all__ = ["RPC_ERRORS", "rpc"]

#: what a call through :func:`rpc` raises when supervisord is gone or refuses
RPC_ERRORS = (OSError, xmlrpc.client.Error, http.client.HTTPException)


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
