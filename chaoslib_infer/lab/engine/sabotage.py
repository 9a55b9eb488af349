"""ASGI-level effects of fault modes: connection resets, the log filter for them, hung requests."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct

from starlette.responses import JSONResponse

from chaoslib_infer.lab.engine.faults import FaultSpec
from chaoslib_infer.lab.engine.wire import Receive, Scope, Send, error_body


def arm_reset(scope: Scope) -> bool:
    """Make the close of this request's TCP connection an abort (RST), via ``SO_LINGER`` 0.

    Finds the connection's socket among the process's file descriptors by its local port and peer
    address (ASGI does not expose the transport). Returns False when there is no such socket (an
    in-process ASGI transport): the close is then a plain one, still without a complete reply.
    """
    client, server = scope.get("client"), scope.get("server")
    if not client or not server:
        return False
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return False
    for name in names:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        with sock:
            try:
                if sock.type != socket.SOCK_STREAM:
                    continue
                peer, local = sock.getpeername(), sock.getsockname()
            except OSError:
                continue
            if (
                isinstance(peer, tuple)
                and tuple(peer[:2]) == (client[0], client[1])
                and local[1] == server[1]
            ):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return True
    return False


class AbortLogFilter(logging.Filter):
    """Drops uvicorn's "returned without completing response" error for injected resets only."""

    pending = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """Return False for the log line of an injected reset."""
        if AbortLogFilter.pending > 0 and "without completing response" in record.getMessage():
            AbortLogFilter.pending -= 1
            return False
        return True


ABORT_LOG_FILTER = AbortLogFilter()


class HangResponse:
    """ASGI response of the ``hang`` fault: sends nothing until the client leaves, or until the
    hang is cleared (``DELETE /admin/faults``) or its ``ttl_s`` runs out: then a 503, so no hung
    connection outlives the fault (a load balancer keeps its side open after the client left)."""

    def __init__(self, hung: set[asyncio.Future[None]], spec: FaultSpec) -> None:
        self.hung = hung
        self.spec = spec

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        released: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.hung.add(released)

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        watcher = asyncio.ensure_future(watch())
        timeout = self.spec.remaining_s()
        try:
            await asyncio.wait({watcher, released}, timeout=timeout, return_when="FIRST_COMPLETED")
            if not watcher.done():
                body = error_body(503, "engine fault hang cleared: request dropped")
                await JSONResponse(body, status_code=503)(scope, receive, send)
        finally:
            watcher.cancel()
            self.hung.discard(released)
            if not released.done():
                released.cancel()
