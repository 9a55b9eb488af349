"""Network jitter on our own side of the wire to a managed endpoint: :class:`JitterProxy`, a
loopback forwarder owned by the certification's client (nothing on the provider's machines, so
nothing to roll back; :mod:`chaoslib_infer.platforms.endpoint`).

Split out of :mod:`chaoslib_infer.platforms.endpoint`, which re-exports :class:`JitterProxy`
(import path kept).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

__all__ = ["JitterProxy"]


class JitterProxy:
    """Network jitter injected in our own transport: a loopback forwarder owned by this client.

    The load client connects to ``127.0.0.1:<port>`` (plain HTTP, the target's ``Host`` header)
    and the proxy forwards each connection to the target (TLS to the target when its URL is
    https, with the target's host name for SNI and certificate checks), so the provider sees an
    ordinary client. Delay semantics are those of the lab's byte-stream shim
    (``chaoslib_infer.lab.shim``): every block read from one side is released to the other at
    ``max(arrival + d, release of the previous block in that direction)``, order kept, with ``d``
    drawn per block from ``normal`` N(delay, jitter) clipped at 0 or ``uniform`` delay +- jitter,
    in both directions, only while the window set by :meth:`activate` is open. Blocks are
    whatever one ``read`` returned (a TCP segment or several). The applied delays are this fault's
    ground truth (:meth:`stats`). The proxy lives in the certification's event loop and stops
    with it: nothing outlives the run.

    Args:
        upstream_url: the target's URL (scheme, host and port are used).
        delay_s: mean delay per block, seconds.
        jitter_s: normal: standard deviation; uniform: half-width, seconds.
        distribution: ``normal`` or ``uniform``.
        seed: RNG seed.
        connect_timeout_s: upstream connect limit, seconds.

    Raises:
        ValueError: negative delay/jitter, unknown distribution, a URL without a host.
    """

    def __init__(
        self,
        upstream_url: str,
        delay_s: float,
        jitter_s: float,
        distribution: str = "normal",
        seed: int = 0,
        connect_timeout_s: float = 10.0,
    ) -> None:
        from urllib.parse import urlsplit

        from chaoslib_infer.lab.jitter import DelaySampler, RunningStats

        parts = urlsplit(upstream_url)
        if not parts.hostname:
            raise ValueError(f"no host in {upstream_url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.netloc = parts.netloc.rsplit("@", 1)[-1]
        self.sampler = DelaySampler(delay_s, jitter_s, distribution, seed)
        self.uplink = RunningStats()
        self.downlink = RunningStats()
        self.connections = 0
        self.connect_failures = 0
        self.connect_timeout_s = connect_timeout_s
        self.window: tuple[float, float] = (math.inf, math.inf)
        self.listen_port: int | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    def activate(self, start_mono: float, end_mono: float) -> None:
        """Open the window ``[start_mono, end_mono)`` (``time.monotonic()`` seconds)."""
        self.window = (start_mono, end_mono)

    def active(self, now: float | None = None) -> bool:
        """True inside the window."""
        t = time.monotonic() if now is None else now
        return self.window[0] <= t < self.window[1]

    def url_for(self, url: str) -> str:
        """``url`` with its scheme and host replaced by this proxy (path and query kept)."""
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(url)
        return urlunsplit(("http", f"127.0.0.1:{self.listen_port}", parts.path, parts.query, ""))

    async def start(self) -> None:
        """Listen on a free loopback port (``listen_port``)."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.listen_port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and cut every proxied connection."""
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):  # the pumps then see EOF or an error and end
            w.close()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=2.0)
        for t in list(self._tasks):
            t.cancel()  # _handle swallows its own cancellation (asyncio logs it otherwise)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> JitterProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        up_w: asyncio.StreamWriter | None = None
        self._writers.add(writer)
        try:
            try:
                up_r, upstream = await asyncio.wait_for(
                    asyncio.open_connection(
                        self.host, self.port, ssl=True if self.tls else None,
                        server_hostname=self.host if self.tls else None,
                    ),
                    self.connect_timeout_s,
                )  # fmt: skip
            except (OSError, TimeoutError):
                self.connect_failures += 1
                return
            up_w = upstream
            self._writers.add(upstream)
            self.connections += 1
            await asyncio.gather(
                self._pump(reader, upstream, self.uplink), self._pump(up_r, writer, self.downlink)
            )
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a cut connection (or close()) ends the forwarding; nothing to report
        finally:
            for w in (writer, up_w):
                if w is not None:
                    w.close()
                    self._writers.discard(w)
            if task is not None:
                self._tasks.discard(task)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, st: Any) -> None:
        """Copy ``src`` to ``dst``, each block held until its release time (class docstring)."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def deliver() -> None:
            while True:
                item = await queue.get()
                if item is None:
                    if dst.can_write_eof():
                        dst.write_eof()
                    return
                release, data = item
                delay = release - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                dst.write(data)
                await dst.drain()

        writer_task = asyncio.create_task(deliver())
        last = 0.0
        try:
            while True:
                data = await src.read(65536)
                now = loop.time()
                if not data:
                    break
                if self.active():
                    release = max(now + self.sampler.sample(), last)
                    st.add(release - now)
                else:
                    release = max(now, last)
                last = release
                queue.put_nowait((release, data))
        except OSError:
            pass
        finally:
            queue.put_nowait(None)
            try:
                await writer_task
            except (OSError, RuntimeError):
                pass

    def stats(self) -> dict[str, Any]:
        """Ground truth: configured parameters, the delays actually applied per direction,
        proxied connections."""
        return {
            "mechanism": "loopback jitter proxy in the client (chaoslib_infer.platforms."
            "endpoint.JitterProxy)",
            "delay_s": self.sampler.delay_s,
            "jitter_s": self.sampler.jitter_s,
            "distribution": self.sampler.distribution,
            "uplink": self.uplink.as_dict(),
            "downlink": self.downlink.as_dict(),
            "connections": self.connections,
            "connect_failures": self.connect_failures,
        }
