"""Stream-level network jitter for kernels without ``netem``: a delaying TCP proxy.

Where the kernel has no ``netem`` qdisc (``chaoslib_infer.lab.netem.netem_available()`` is False),
the lab emulates a jittery link to one replica with this proxy, which forwards to the replica's
real address and delays every chunk of the byte stream, in both directions. HAProxy routes the
replica's traffic through it with a **detour server** (:func:`divert_to_detour`): a run-time server
``engines/rN-jitter`` at the shim's address (``add server``, same options as the lab's
``default-server``), and the replica's own server in maintenance so that none of its pooled
keep-alive connections is reused; in-flight requests finish on their old path. Undo
(:func:`restore_from_detour`, :func:`delete_detour`) makes the replica's server ready again, the
detour takes no new request, in-flight ones drain through the shim, then the detour is deleted.
(A plain ``set server engines/rN addr 127.0.0.1 port <shim>`` was measured first: HAProxy 2.6
kept sending most of the replica's requests over the keep-alive connections to the old address.)

Run as ``python -m chaoslib_infer.lab.shim --upstream HOST:PORT --delay-ms 400 --jitter-ms 300
[--loss-pct 0] [--distribution normal|uniform] [--seed N] [--ttl-s 60] [--drain-s 10]
[--stats FILE] [--events FILE] [--haproxy-sock SOCK --server engines/r0 --detour r0-jitter]
[--label TOKEN] [--listen 127.0.0.1:0]``.
It prints one line ``listening <port> <pid>`` on stdout once it accepts connections.

The HAProxy detour helpers live in :mod:`chaoslib_infer.lab.detour`, the delay distribution and
its running statistics in :mod:`chaoslib_infer.lab.jitter`, the configuration and the command
line's parser in :mod:`chaoslib_infer.lab.shim_config`; all are re-exported here.

Semantics (what the figures may rely on):

* **Delay and jitter.** Each chunk read from one side is released to the other side at
  ``max(arrival + d, release of the previous chunk in that direction)`` where ``d`` is drawn from
  the seeded distribution: ``normal`` = N(delay, jitter) clipped at 0 (netem's ``distribution
  normal`` with jitter as sigma), ``uniform`` = U(delay - jitter, delay + jitter) clipped at 0.
  Order is preserved per direction, as TCP's in-order delivery would preserve it; a chunk is
  whatever one ``recv`` returned (a TCP segment or several), so this is jitter at the granularity
  of application writes, not of packets.
* **Loss.** Each chunk is "lost" with probability ``loss_pct / 100``; a stream proxy cannot drop
  bytes without corrupting the stream (TCP would retransmit them), so the nearest stream-level
  equivalent of heavy loss is used: the connection is reset (RST) on both sides.
* **Dead-man switch.** The shim stops by itself after ``--ttl-s`` seconds. When it stops (TTL,
  SIGTERM, SIGINT or SIGHUP) and ``--haproxy-sock``/``--server``/``--detour`` are given, it first
  routes the traffic back (:func:`restore_from_detour`, a ``removed`` event with ``by:
  "shim:<reason>"`` in ``--events``) if the drill's undo has not done it yet, then ends the
  connections as removing a qdisc would not cut them: idle keep-alive connections are closed
  at once (FIN), a response in flight is let finish (the shim reads HTTP/1.1 chunked framing:
  a request received makes a connection busy, the chunked terminator ``0\r\n\r\n`` coming down
  ends it) for at most ``--drain-s`` seconds (10), only what is still busy then is reset, and
  the detour is deleted. (Before, every connection left after 2 s was reset, idle or not: a
  long stream cut at removal was retried by the client and counted as a duplicate generation
  against the service.) Stats ``removal_idle_closed``, ``removal_drained``, ``removal_reset``.
* **Stats.** ``--stats FILE`` gets a JSON summary (connections, chunks and bytes per direction,
  resets, sampled and applied delays: count, mean, stdev, min, max in seconds), rewritten every
  second and at exit: the lab's ground truth for what the shim did.

Limitations: the shim sits behind HAProxy, so it delays the link between the load balancer and
one replica, not the client's own link; HAProxy's health checks of the detour go through it too
(as they would through a jittery network), so HAProxy may mark the detour DOWN and route around
the replica for part of the window; requests already in flight on the replica when the fault
starts are not delayed; if the shim is SIGKILLed (no TTL restore) the detour points at a closed
port until the drill's undo, the lab's fault watchdog or ``lab down`` restores the routing,
meanwhile HAProxy's checks mark it DOWN and the other replicas take the traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoslib_infer.lab.detour import ADMIN_FDRAIN as ADMIN_FDRAIN
from chaoslib_infer.lab.detour import ADMIN_FMAINT as ADMIN_FMAINT
from chaoslib_infer.lab.detour import default_server_options as default_server_options
from chaoslib_infer.lab.detour import delete_detour as delete_detour
from chaoslib_infer.lab.detour import divert_to_detour as divert_to_detour
from chaoslib_infer.lab.detour import haproxy_server_addr as haproxy_server_addr
from chaoslib_infer.lab.detour import haproxy_servers_state as haproxy_servers_state
from chaoslib_infer.lab.detour import restore_from_detour as restore_from_detour
from chaoslib_infer.lab.jitter import DISTRIBUTIONS as DISTRIBUTIONS
from chaoslib_infer.lab.jitter import DelaySampler as DelaySampler
from chaoslib_infer.lab.jitter import RunningStats as RunningStats
from chaoslib_infer.lab.recorder import append_event
from chaoslib_infer.lab.shim_config import DRAIN_S as DRAIN_S
from chaoslib_infer.lab.shim_config import SHIM_MODULE as SHIM_MODULE
from chaoslib_infer.lab.shim_config import ShimConfig as ShimConfig
from chaoslib_infer.lab.shim_config import build_parser as build_parser
from chaoslib_infer.lab.shim_config import config_from_args as config_from_args

__all__ = [
    "DISTRIBUTIONS",
    "DRAIN_S",
    "SHIM_MODULE",
    "DelaySampler",
    "JitterShim",
    "RunningStats",
    "ShimConfig",
    "default_server_options",
    "delete_detour",
    "divert_to_detour",
    "haproxy_server_addr",
    "haproxy_servers_state",
    "main",
    "restore_from_detour",
]

READ_SIZE = 65536
CONNECT_TIMEOUT_S = 3.0
STATS_PERIOD_S = 1.0


@dataclass
class _Conn:
    """One proxied connection's HTTP/1.1 state, as far as removal needs it."""

    down: asyncio.StreamWriter
    up: asyncio.StreamWriter | None = None
    #: a request went up and its response has not ended (chunked terminator) yet
    busy: bool = False
    tail: bytes = b""


@dataclass
class _Direction:
    chunks: int = 0
    bytes: int = 0


@dataclass
class _Stats:
    started_at: float = field(default_factory=time.time)
    connections: int = 0
    active: int = 0
    resets: int = 0
    upstream_connect_failures: int = 0
    #: at removal: idle keep-alive connections closed (FIN), streams let finish, streams reset
    removal_idle_closed: int = 0
    removal_drained: int = 0
    removal_reset: int = 0
    up: _Direction = field(default_factory=_Direction)
    down: _Direction = field(default_factory=_Direction)
    sampled: RunningStats = field(default_factory=RunningStats)
    applied: RunningStats = field(default_factory=RunningStats)


class _Reset(Exception):
    """A chunk was lost: reset the connection."""


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), dropping anything unsent."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# --------------------------------------------------------------------------------------------
# The proxy
# --------------------------------------------------------------------------------------------
class JitterShim:
    """asyncio TCP proxy delaying and jittering both directions (see the module docstring)."""

    def __init__(self, config: ShimConfig) -> None:
        """Prepare (nothing listens before :meth:`start`).

        Raises:
            ValueError: bad delay, jitter, loss or distribution.
        """
        self.config = config
        self.sampler = DelaySampler(
            config.delay_s, config.jitter_s, config.distribution, config.seed, config.loss
        )
        self.stats = _Stats()
        self.port: int | None = None
        self._server: asyncio.Server | None = None
        self._conns: dict[asyncio.StreamWriter, _Conn] = {}
        self._draining = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stop = asyncio.Event()
        self.stop_reason = ""

    async def start(self) -> int:
        """Listen; returns the port (``listen_port`` 0 picks a free one)."""
        self._server = await asyncio.start_server(
            self._handle, self.config.listen_host, self.config.listen_port, reuse_address=True
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def request_stop(self, reason: str) -> None:
        """Ask :meth:`serve` to stop (signal handler, TTL)."""
        if not self.stop_reason:
            self.stop_reason = reason
        self._stop.set()

    async def serve(self) -> str:
        """Serve until stopped (TTL, :meth:`request_stop`); restore HAProxy, drain, close.

        Returns:
            Why it stopped (``"ttl"``, ``"SIGTERM"``...).
        """
        if self._server is None:
            await self.start()
        loop = asyncio.get_running_loop()
        ttl = loop.call_later(self.config.ttl_s, self.request_stop, "ttl")
        writer = asyncio.create_task(self._stats_forever())
        try:
            await self._stop.wait()
        finally:
            ttl.cancel()
            await self.shutdown()
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            self.write_stats(final=True)
        return self.stop_reason

    async def shutdown(self) -> None:
        """Restore HAProxy (if it still points here), stop accepting, then end the connections
        as removing a qdisc would not cut them: idle keep-alive ones are closed at once (FIN;
        HAProxy takes no new request to the detour, in maintenance now), a response in flight
        is let finish (its chunked terminator) for up to ``drain_s``, and only what is left
        then is reset. The counts are the stats' ``removal_*``."""
        await asyncio.get_running_loop().run_in_executor(None, self.restore_haproxy)
        if self._server is not None:
            self._server.close()
        self._draining = True
        for conn in list(self._conns.values()):
            if not conn.busy:
                self.stats.removal_idle_closed += 1
                self._close(conn)
        deadline = time.monotonic() + self.config.drain_s
        while any(c.busy for c in self._conns.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self._conns.values()):
            if conn.busy:
                self.stats.removal_reset += 1
            _abort(conn.down)
            if conn.up is not None:
                _abort(conn.up)
        tasks = [t for t in self._tasks if not t.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self.delete_detour)

    @staticmethod
    def _close(conn: _Conn) -> None:
        for w in (conn.down, conn.up):
            if w is not None and not w.transport.is_closing():
                w.close()

    def _sent_up(self, conn: _Conn, data: bytes) -> None:
        conn.busy = True  # request bytes: a response is owed
        conn.tail = b""

    def _sent_down(self, conn: _Conn, data: bytes) -> None:
        tail = (conn.tail + data)[-5:]
        conn.tail = tail
        if conn.busy and tail == b"0\r\n\r\n":  # the chunked response ended
            conn.busy = False
            if self._draining:
                self.stats.removal_drained += 1
                self._close(conn)

    def _haproxy_target(self) -> tuple[Path, str, str, str] | None:
        cfg = self.config
        if cfg.haproxy_sock is None or not cfg.backend or not cfg.server or not cfg.detour:
            return None
        return cfg.haproxy_sock, cfg.backend, cfg.server, cfg.detour

    def restore_haproxy(self) -> str | None:
        """Route the replica's traffic back to it (the server ready, the detour in maintenance)
        if it still goes through the detour; appends a ``removed`` event to ``--events``.

        Returns:
            What was done (None when nothing was configured or nothing needed doing).
        """
        target = self._haproxy_target()
        if target is None:
            return None
        sock, backend, server, detour = target
        try:
            if not restore_from_detour(sock, backend, server, detour):
                return None
        except OSError as exc:
            print(f"shim: cannot restore HAProxy {server}: {exc}", file=sys.stderr, flush=True)
            return None
        cfg = self.config
        note = f"restored {backend}/{server} (detour {detour} in maintenance)"
        if cfg.events_path is not None:
            with contextlib.suppress(OSError):
                append_event(
                    cfg.events_path,
                    {
                        "t": time.time(),
                        "event": "network-jitter",
                        "phase": "removed",
                        "by": f"shim:{self.stop_reason or 'stop'}",
                        "replica": server,
                        "token": cfg.label,
                        "shim_pid": os.getpid(),
                        "addr": f"{cfg.upstream_host}:{cfg.upstream_port}",
                    },
                )
        print(f"shim: {note}", file=sys.stderr, flush=True)
        return note

    def delete_detour(self) -> bool | None:
        """Delete the detour server once this shim's connections are closed (None: no HAProxy)."""
        target = self._haproxy_target()
        if target is None:
            return None
        sock, backend, _, detour = target
        try:
            return delete_detour(sock, backend, detour)
        except OSError:
            return False

    def snapshot(self) -> dict[str, Any]:
        """JSON-able stats (see the module docstring)."""
        s, cfg = self.stats, self.config
        return {
            "pid": os.getpid(),
            "label": cfg.label,
            "listen_port": self.port,
            "upstream": f"{cfg.upstream_host}:{cfg.upstream_port}",
            "delay_s": cfg.delay_s,
            "jitter_s": cfg.jitter_s,
            "loss": cfg.loss,
            "distribution": cfg.distribution,
            "seed": cfg.seed,
            "started_at": s.started_at,
            "updated_at": time.time(),
            "stopped": bool(self.stop_reason),
            "stop_reason": self.stop_reason or None,
            "connections": s.connections,
            "active_connections": s.active,
            "resets": s.resets,
            "upstream_connect_failures": s.upstream_connect_failures,
            "removal_idle_closed": s.removal_idle_closed,
            "removal_drained": s.removal_drained,
            "removal_reset": s.removal_reset,
            "chunks_up": s.up.chunks,
            "bytes_up": s.up.bytes,
            "chunks_down": s.down.chunks,
            "bytes_down": s.down.bytes,
            "sampled_delay": s.sampled.as_dict(),
            "applied_delay": s.applied.as_dict(),
        }

    def write_stats(self, final: bool = False) -> None:
        """Rewrite the stats file atomically (no-op without ``stats_path``)."""
        path = self.config.stats_path
        if path is None:
            return
        data = self.snapshot()
        data["final"] = final
        tmp = path.with_name(path.name + ".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(data, indent=1) + "\n")
            os.replace(tmp, path)

    async def _stats_forever(self) -> None:
        while True:
            self.write_stats()
            await asyncio.sleep(STATS_PERIOD_S)

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        s = self.stats
        s.connections += 1
        s.active += 1
        me = asyncio.current_task()
        if me is not None:
            self._tasks.add(me)
        conn = _Conn(cwriter)
        self._conns[cwriter] = conn
        uwriter: asyncio.StreamWriter | None = None
        pumps: list[asyncio.Task[None]] = []
        try:
            try:
                ureader, up_w = await asyncio.wait_for(
                    asyncio.open_connection(self.config.upstream_host, self.config.upstream_port),
                    CONNECT_TIMEOUT_S,
                )
            except (TimeoutError, OSError):
                s.upstream_connect_failures += 1
                _abort(cwriter)
                return
            uwriter = conn.up = up_w
            up = asyncio.create_task(
                # busy as soon as request bytes arrive, not once their delay let them go up:
                # a request held in the delay queue at the removal is in flight, not idle
                self._pump(creader, up_w, s.up, received=lambda d: self._sent_up(conn, d))
            )
            down = asyncio.create_task(
                self._pump(ureader, cwriter, s.down, lambda d: self._sent_down(conn, d))
            )
            pumps = [up, down]
            done, pending = await asyncio.wait({up, down}, return_when=asyncio.FIRST_EXCEPTION)
            failed = any(t.exception() is not None for t in done if not t.cancelled())
            if failed:
                if any(isinstance(t.exception(), _Reset) for t in done if not t.cancelled()):
                    s.resets += 1
                for t in pending:
                    t.cancel()
                _abort(cwriter)
                _abort(up_w)
                await asyncio.gather(*pending, return_exceptions=True)
            else:
                await asyncio.gather(*pending, return_exceptions=True)
        except asyncio.CancelledError:  # shutdown: a connection handler ends quietly
            _abort(cwriter)
            if uwriter is not None:
                _abort(uwriter)
            for t in pumps:
                t.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            if me is not None:
                self._tasks.discard(me)
            self._conns.pop(cwriter, None)
            s.active -= 1
            for w in (cwriter, uwriter):
                if w is not None and not w.transport.is_closing():
                    w.close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        direction: _Direction,
        written: Callable[[bytes], None] | None = None,
        received: Callable[[bytes], None] | None = None,
    ) -> None:
        """Copy one direction, releasing each chunk at its (order-preserving) jittered time
        (``received(data)`` as each chunk is read, before its delay; ``written(data)`` after it
        is handed to ``writer``)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, float, bytes | None]] = asyncio.Queue()

        async def release() -> None:
            while True:
                due, arrived, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if data is None:
                    if writer.can_write_eof():
                        with contextlib.suppress(OSError):
                            writer.write_eof()
                    return
                writer.write(data)
                self.stats.applied.add(loop.time() - arrived)
                if written is not None:
                    written(data)
                await writer.drain()

        sender = asyncio.create_task(release())
        last_due = 0.0
        try:
            while True:
                read = asyncio.ensure_future(reader.read(READ_SIZE))
                done, _ = await asyncio.wait({read, sender}, return_when=asyncio.FIRST_COMPLETED)
                if sender in done:  # the writing side failed (peer reset)
                    read.cancel()
                    sender.result()
                    return
                data = read.result()
                now = loop.time()
                if not data:
                    queue.put_nowait((max(now, last_due), now, None))
                    break
                if self.sampler.lost():
                    raise _Reset()
                d = self.sampler.sample()
                self.stats.sampled.add(d)
                last_due = max(now + d, last_due)
                direction.chunks += 1
                direction.bytes += len(data)
                if received is not None:
                    received(data)
                queue.put_nowait((last_due, now, data))
            await sender
        finally:
            if not sender.done():
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await sender


async def _amain(config: ShimConfig) -> str:
    shim = JitterShim(config)
    port = await shim.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, shim.request_stop, signal.Signals(sig).name)
    print(f"listening {port} {os.getpid()}", flush=True)
    with contextlib.suppress(OSError):  # nobody reads stdout after the first line
        sys.stdout.close()
    return await shim.serve()


def main(argv: list[str] | None = None) -> int:
    """Entry point: run one shim until its TTL or a signal. Returns 0."""
    config = config_from_args(argv)
    reason = asyncio.run(_amain(config))
    print(f"shim: stopped ({reason})", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
