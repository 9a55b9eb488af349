"""Loopback ports and HTTP probes of the lab: a free port, is a port free, one GET's status.

A leaf module used by the lab's lifecycle (ports at ``Lab.up``, readiness) and ``Lab.status``.
"""

from __future__ import annotations

import http.client
import socket

__all__ = ["free_port", "http_status", "port_free"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_free(port: int) -> bool:
    """True when TCP ``port`` on 127.0.0.1 can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def http_status(
    port: int, path: str = "/health", timeout_s: float = 0.5, host: str = "127.0.0.1"
) -> int | None:
    """HTTP status of ``GET path`` on ``host:port``; None when nothing answered in time."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
