"""HAProxy's detour server for one replica: the runtime API helpers the network-jitter drill and
the jitter shim's own dead-man restore share (``add server`` with the lab's ``default-server``
options, the replica's server in maintenance, then back, then the detour deleted).

Split out of :mod:`chaoslib_infer.lab.shim` (whose module docstring tells why a detour server and
not ``set server ... addr``), which re-exports every name here (import paths kept).
"""

from __future__ import annotations

import time
from pathlib import Path

from chaoslib_infer.lab import haproxy as hap

__all__ = [
    "ADMIN_FDRAIN",
    "ADMIN_FMAINT",
    "default_server_options",
    "delete_detour",
    "divert_to_detour",
    "haproxy_server_addr",
    "haproxy_servers_state",
    "restore_from_detour",
]


# --------------------------------------------------------------------------------------------
# HAProxy runtime API helpers (used by the drill and by the shim's own dead-man restore)
# --------------------------------------------------------------------------------------------
#: ``srv_admin_state`` bits (HAProxy ``SRV_ADMF_*``): forced maintenance, forced drain.
ADMIN_FMAINT = 0x01
ADMIN_FDRAIN = 0x08


#: HAProxy's runtime ``show servers state`` (:func:`chaoslib_infer.lab.haproxy.servers_state`),
#: under the name this module has always exported.
haproxy_servers_state = hap.servers_state


def haproxy_server_addr(sock_path: Path, backend: str, server: str) -> tuple[str, int]:
    """Current address of one HAProxy server.

    Returns:
        ``(addr, port)``.

    Raises:
        OSError: the socket does not answer.
        LookupError: no such server.
    """
    row = haproxy_servers_state(sock_path, backend).get(server)
    if row is None:
        raise LookupError(f"HAProxy has no server {backend}/{server}")
    return row["srv_addr"], int(row["srv_port"])


def _admin(row: dict[str, str] | None) -> int:
    try:
        return int((row or {}).get("srv_admin_state", "0"))
    except ValueError:
        return 0


def _command(sock_path: Path, command: str) -> str:
    answer = hap.stats_command(sock_path, command).strip()
    low = answer.lower()
    if any(
        w in low for w in ("no such", "unknown", "require", "invalid", "error", "only ", "not ")
    ):
        raise RuntimeError(f"HAProxy refused {command!r}: {answer}")
    return answer


def default_server_options(haproxy_cfg: Path) -> list[str]:
    """Options of the ``default-server`` line of ``haproxy_cfg`` (e.g. ``["inter", "500ms",
    "fall", "2", "rise", "2", "maxconn", "32"]``): a server added at run time does not inherit
    them, so the detour copies them to behave (health checks, queueing) like the server it
    stands in for. [] when there is no such line or no file."""
    try:
        text = haproxy_cfg.read_text()
    except OSError:
        return []
    for ln in text.splitlines():
        words = ln.split()
        if words[:1] == ["default-server"]:
            return words[1:]
    return []


def divert_to_detour(
    sock_path: Path,
    backend: str,
    server: str,
    detour: str,
    port: int,
    options: list[str],
    host: str = "127.0.0.1",
) -> None:
    """Send ``backend/server``'s new requests through ``host:port`` (the shim).

    Adds a run-time server ``detour`` at ``host:port`` with ``check`` and ``options``, enables its
    health checks and makes it ready, then puts ``server`` into maintenance: new requests go to
    the detour, requests in flight on ``server`` finish normally.

    Why not ``set server ... addr``: HAProxy 2.6 keeps reusing the keep-alive connections
    attached to client sessions for the *old* address after an address change (measured here:
    9 of 14 requests to the re-pointed replica bypassed the new address, also after a
    maint/ready flush of the idle pool); a server in maintenance is never selected, so none of its
    connections is reused.

    Raises:
        OSError: the socket does not answer.
        RuntimeError: HAProxy refused a command, or ``server`` is already in an administrative
            state (maintenance, drain) that something else owns.
    """
    rows = haproxy_servers_state(sock_path, backend)
    if server not in rows:
        raise RuntimeError(f"HAProxy has no server {backend}/{server}")
    if _admin(rows[server]) & (ADMIN_FMAINT | ADMIN_FDRAIN):
        raise RuntimeError(
            f"{backend}/{server} is already in maintenance or drain (admin state "
            f"{rows[server].get('srv_admin_state')}): another fault owns it"
        )
    if detour in rows:
        raise RuntimeError(f"HAProxy already has a server {backend}/{detour}")
    _command(
        sock_path, f"add server {backend}/{detour} {host}:{int(port)} check {' '.join(options)}"
    )
    hap.stats_command(sock_path, f"enable health {backend}/{detour}")
    hap.stats_command(sock_path, f"set server {backend}/{detour} state ready")
    hap.stats_command(sock_path, f"set server {backend}/{server} state maint")


def restore_from_detour(sock_path: Path, backend: str, server: str, detour: str) -> bool:
    """Undo :func:`divert_to_detour`'s routing: ``server`` ready again, ``detour`` in maintenance
    (it takes no new request; in-flight ones finish). Idempotent.

    Returns:
        True when traffic was diverted and is now restored; False when there was nothing to do
        (no detour, or already in maintenance).

    Raises:
        OSError: the socket does not answer.
    """
    rows = haproxy_servers_state(sock_path, backend)
    det = rows.get(detour)
    if det is None or _admin(det) & ADMIN_FMAINT:
        return False
    if server in rows and _admin(rows[server]) & ADMIN_FMAINT:
        hap.stats_command(sock_path, f"set server {backend}/{server} state ready")
    hap.stats_command(sock_path, f"set server {backend}/{detour} state maint")
    return True


def delete_detour(sock_path: Path, backend: str, detour: str, timeout_s: float = 2.0) -> bool:
    """Delete the run-time server ``detour`` once its connections are gone (HAProxy refuses to
    delete a server that still has connections; retried until ``timeout_s``).

    Returns:
        True when it is gone (or never existed); False when it is still there (left in
        maintenance, where it takes no traffic).

    Raises:
        OSError: the socket does not answer.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        rows = haproxy_servers_state(sock_path, backend)
        if detour not in rows:
            return True
        if not _admin(rows[detour]) & ADMIN_FMAINT:
            hap.stats_command(sock_path, f"set server {backend}/{detour} state maint")
        answer = hap.stats_command(sock_path, f"del server {backend}/{detour}")
        if "deleted" in answer.lower():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
