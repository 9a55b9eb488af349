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
  a request sent up makes a connection busy, the chunked terminator ``0\r\n\r\n`` coming down
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

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.lab.recorder import append_event

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

SHIM_MODULE = "chaoslib_infer.lab.shim"
DISTRIBUTIONS = ("normal", "uniform")
READ_SIZE = 65536
CONNECT_TIMEOUT_S = 3.0
STATS_PERIOD_S = 1.0
#: seconds a response in flight at removal may take to finish before it is reset
DRAIN_S = 10.0


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


# --------------------------------------------------------------------------------------------
# Delay distribution and stats
# --------------------------------------------------------------------------------------------
class DelaySampler:
    """Seeded per-chunk delay: ``normal`` N(delay, jitter) or ``uniform`` delay +- jitter, >= 0."""

    def __init__(
        self,
        delay_s: float,
        jitter_s: float,
        distribution: str = "normal",
        seed: int | None = None,
        loss: float = 0.0,
    ) -> None:
        """Args:
            delay_s: mean delay per chunk, seconds (>= 0).
            jitter_s: normal: standard deviation; uniform: half-width, seconds (>= 0).
            distribution: one of :data:`DISTRIBUTIONS`.
            seed: RNG seed (None: random).
            loss: probability (0..1) that a chunk is lost (the connection is reset).

        Raises:
            ValueError: a negative delay or jitter, loss outside 0..1, unknown distribution.
        """
        if not (delay_s >= 0 and jitter_s >= 0):
            raise ValueError(f"delay and jitter must be >= 0, got {delay_s!r}, {jitter_s!r}")
        if not 0.0 <= loss <= 1.0:
            raise ValueError(f"loss must be a probability in [0, 1], got {loss!r}")
        if distribution not in DISTRIBUTIONS:
            raise ValueError(
                f"unknown distribution {distribution!r}; the shim supports {', '.join(DISTRIBUTIONS)}"
            )
        self.delay_s = float(delay_s)
        self.jitter_s = float(jitter_s)
        self.distribution = distribution
        self.loss = float(loss)
        self._rng = random.Random(seed)

    def sample(self) -> float:
        """One delay in seconds (>= 0)."""
        if self.jitter_s == 0:
            return self.delay_s
        if self.distribution == "normal":
            d = self._rng.gauss(self.delay_s, self.jitter_s)
        else:
            d = self._rng.uniform(self.delay_s - self.jitter_s, self.delay_s + self.jitter_s)
        return d if d > 0 else 0.0

    def lost(self) -> bool:
        """True with probability ``loss`` (a lost chunk: reset the connection)."""
        return self.loss > 0 and self._rng.random() < self.loss


@dataclass
class RunningStats:
    """Welford accumulator: count, mean, stdev (sample), min, max."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    lo: float = math.inf
    hi: float = -math.inf

    def add(self, x: float) -> None:
        """Add one observation."""
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)
        self.lo = min(self.lo, x)
        self.hi = max(self.hi, x)

    def as_dict(self) -> dict[str, float | int | None]:
        """``{"n", "mean_s", "stdev_s", "min_s", "max_s"}`` (None without data)."""
        if self.n == 0:
            return {"n": 0, "mean_s": None, "stdev_s": None, "min_s": None, "max_s": None}
        sd = math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else 0.0
        return {"n": self.n, "mean_s": self.mean, "stdev_s": sd, "min_s": self.lo, "max_s": self.hi}


@dataclass
class ShimConfig:
    """Everything one shim process needs (see the module docstring). Times in seconds."""

    upstream_host: str
    upstream_port: int
    delay_s: float
    jitter_s: float
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    loss: float = 0.0
    distribution: str = "normal"
    seed: int | None = None
    ttl_s: float = 60.0
    drain_s: float = DRAIN_S
    stats_path: Path | None = None
    events_path: Path | None = None
    haproxy_sock: Path | None = None
    backend: str | None = None
    server: str | None = None
    detour: str | None = None
    label: str = ""


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
                self._pump(creader, up_w, s.up, lambda d: self._sent_up(conn, d))
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
    ) -> None:
        """Copy one direction, releasing each chunk at its (order-preserving) jittered time
        (``written(data)`` after each chunk is handed to ``writer``)."""
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
                queue.put_nowait((last_due, now, data))
            await sender
        finally:
            if not sender.done():
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await sender


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def _hostport(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host, int(port)


def build_parser() -> argparse.ArgumentParser:
    """Argument parser of ``python -m chaoslib_infer.lab.shim``."""
    p = argparse.ArgumentParser(prog=f"python -m {SHIM_MODULE}", description=__doc__.split("\n")[0])
    p.add_argument("--upstream", type=_hostport, required=True, help="HOST:PORT to forward to")
    p.add_argument("--listen", type=_hostport, default=("127.0.0.1", 0), help="HOST:PORT (port 0)")
    p.add_argument("--delay-ms", type=float, required=True, help="mean delay per chunk, ms")
    p.add_argument("--jitter-ms", type=float, default=0.0, help="jitter (normal: sigma), ms")
    p.add_argument("--loss-pct", type=float, default=0.0, help="chunk loss (connection reset), %%")
    p.add_argument("--distribution", choices=DISTRIBUTIONS, default="normal")
    p.add_argument("--seed", type=int, default=None, help="RNG seed (default random)")
    p.add_argument("--ttl-s", type=float, default=60.0, help="dead-man switch: exit after, s")
    p.add_argument(
        "--drain-s",
        type=float,
        default=DRAIN_S,
        help="at stop, seconds a response in flight may take to finish before it is reset",
    )
    p.add_argument("--stats", type=Path, default=None, help="stats JSON file")
    p.add_argument("--events", type=Path, default=None, help="lab events.jsonl (restore events)")
    p.add_argument("--haproxy-sock", type=Path, default=None, help="HAProxy admin socket")
    p.add_argument("--server", default=None, help="BACKEND/SERVER to restore at stop")
    p.add_argument("--detour", default=None, help="the run-time server routing to this shim")
    p.add_argument("--label", default="", help="free text recorded in stats and events")
    return p


def config_from_args(argv: list[str] | None = None) -> ShimConfig:
    """Parse the CLI into a :class:`ShimConfig` (argparse exits 2 on bad input)."""
    p = build_parser()
    a = p.parse_args(argv)
    backend = server = None
    if a.server:
        backend, _, server = a.server.partition("/")
        if not backend or not server:
            p.error(f"--server must be BACKEND/SERVER, got {a.server!r}")
    if not 0 <= a.loss_pct <= 100:
        p.error(f"--loss-pct must be 0..100, got {a.loss_pct}")
    if a.delay_ms < 0 or a.jitter_ms < 0 or a.ttl_s <= 0 or a.drain_s < 0:
        p.error("--delay-ms, --jitter-ms, --drain-s must be >= 0 and --ttl-s > 0")
    return ShimConfig(
        upstream_host=a.upstream[0],
        upstream_port=a.upstream[1],
        listen_host=a.listen[0],
        listen_port=a.listen[1],
        delay_s=a.delay_ms / 1000.0,
        jitter_s=a.jitter_ms / 1000.0,
        loss=a.loss_pct / 100.0,
        distribution=a.distribution,
        seed=a.seed,
        ttl_s=a.ttl_s,
        drain_s=a.drain_s,
        stats_path=a.stats,
        events_path=a.events,
        haproxy_sock=a.haproxy_sock,
        backend=backend,
        server=server,
        detour=a.detour,
        label=a.label,
    )


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
