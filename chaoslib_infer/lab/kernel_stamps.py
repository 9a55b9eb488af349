"""Kernel times for the lab engine's TTFT truth (``--ttft-log``): request in, first token out.

The engine's own TTFT clock (``vllm:time_to_first_token_seconds``) starts when its app has the
parsed request and stops when the first token is handed to the transport: the time the request
waited in the engine's event loop before that (accept, read, HTTP parsing behind other
connections) is on neither clock, and a client measured against it is blamed for it. With
``--ttft-log`` the engine serves HTTP through :func:`protocol_class`, uvicorn's httptools protocol
with its reading taken over the way the load client's raw transport does it
(``chaoslib_infer.load.kerneltime``): each connection's socket is read with ``recvmsg`` and
software receive stamps, and written with ``send`` and software transmit stamps. Each request's
ASGI scope then carries a :class:`Stamps` (``scope[SCOPE_KEY]``):

* ``rx_at``: unix seconds (``CLOCK_REALTIME``) at which the kernel received the last segment of the
  read that completed the request (its last byte arrived on the socket);
* ``tx_at``: unix seconds at which the last byte of the latest response write left the socket
  (the transmit stamp, else the time just after ``send`` returned); read right after the first
  token's write, it is when the first token's bytes left.

How the takeover works with uvloop, which starts reading a connection right after
``connection_made``: the accepted socket's ``SO_RCVLOWAT`` is raised first, so the loop's first
poll finds nothing to read; on the loop's next turn the transport's reading is paused, a ``dup`` of
the socket is read by a reader of ours, and ``SO_RCVLOWAT`` goes back to 1. Writes go through the
``dup`` while the loop's transport holds no unsent bytes (else through it, in order). Close, abort,
flow control and everything else go to the loop's transport. Without stamps (not Linux, TLS,
``CHAOS_INFER_KERNEL_TIMESTAMPS=off``) the connection stays the loop's and the stamps are loop
times (``rx_source``/``tx_source`` say which). HTTP/1.1 pipelining is not separated: a request
parsed while the previous reply is still being written takes over the stamps of that reply's
writes (the load clients of this project never pipeline).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from chaoslib_infer.load import kerneltime

__all__ = ["SCOPE_KEY", "Stamps", "protocol_class", "stamps_of"]

#: Key of the :class:`Stamps` in a request's ASGI scope.
SCOPE_KEY = "chaos_infer.kernel_stamps"
_READ_SIZE = 64 * 1024  # under glibc's mmap threshold: a 256 KB buffer costs an mmap a read
_LOWAT_HIGH = 1 << 30  # the kernel caps it at half the receive buffer: still far above a request


@dataclass
class Stamps:
    """One request's kernel times (module docstring); unix seconds, None until known."""

    rx_at: float | None = None
    #: ``"kernel"`` (receive stamp) or ``"loop"`` (the time the request was parsed)
    rx_source: str = "loop"
    tx_at: float | None = None
    #: ``"tx_timestamp"``, ``"send_return"`` or ``"loop"`` (handed to the loop's transport)
    tx_source: str = "loop"


def stamps_of(scope: Mapping[str, Any]) -> Stamps | None:
    """The request's :class:`Stamps`, or None when the server does not take them."""
    got = scope.get(SCOPE_KEY)
    return got if isinstance(got, Stamps) else None


class _StampedTransport:
    """The transport the protocol sees: reads and writes the socket itself, with stamps."""

    def __init__(
        self, real: asyncio.Transport, protocol: asyncio.Protocol, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._real = real
        self._protocol = protocol
        self._loop = loop
        self.sock: socket.socket | None = None
        self._poller: kerneltime.Poller | None = None
        self._paused = False
        self._tx = False
        self._tx_bytes = 0
        #: stamps of the request being served (set by the protocol at each message begin)
        self.box: Stamps | None = None
        #: receive time of the latest read, unix seconds, and whether the kernel stamped it
        self.rx_at: float | None = None
        self.rx_kernel = False
        self._raw: Any = real.get_extra_info("socket")
        try:
            on = kerneltime.mode() != "off"
        except ValueError:
            on = False
        if on and self._raw is not None and not real.get_extra_info("sslcontext"):
            try:
                self._raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, _LOWAT_HIGH)
            except OSError:
                return
            loop.call_soon(self._take_over)

    # ---- the takeover
    def _take_over(self) -> None:
        raw = self._raw
        try:
            if self._real.is_closing():
                return
            dup = socket.socket(fileno=os.dup(raw.fileno()))
        except (OSError, ValueError):
            self._lowat_back(raw)
            return
        rx, tx = kerneltime.enable(dup, tx=kerneltime.mode() == "on")
        self._lowat_back(dup)
        try:
            if not rx:
                raise OSError("no receive stamps")
            self._poller = kerneltime.poller_for(self._loop)
        except OSError:
            dup.close()
            return  # the loop's transport keeps reading: loop times
        dup.setblocking(False)
        self._real.pause_reading()
        self.sock, self._tx = dup, tx
        if not self._paused:
            self._poller.add(dup.fileno(), self._readable)

    @staticmethod
    def _lowat_back(sock: Any) -> None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        except (OSError, ValueError):
            pass

    def _readable(self) -> None:
        sock = self.sock
        if sock is None:
            return
        try:
            data, anc, _, _ = sock.recvmsg(_READ_SIZE, kerneltime.ANC_SIZE)
        except (BlockingIOError, InterruptedError):
            if self._tx:
                kerneltime.tx_stamp(sock)  # an error-queue wake-up: drop stale stamps
            return
        except OSError:
            self.drop()
            self._real.abort()  # the loop's transport reports connection_lost
            return
        wall = time.time()
        if not data:
            self.drop()
            self._protocol.eof_received()
            self._real.close()
            return
        stamp = kerneltime.rx_stamp(anc)
        self.rx_kernel = stamp is not None
        self.rx_at = stamp if stamp is not None and stamp <= wall else wall
        self._protocol.data_received(data)

    def drop(self) -> None:
        """Stop reading the socket and close our descriptor (idempotent)."""
        sock, self.sock = self.sock, None
        if sock is None:
            return
        if self._poller is not None:
            self._poller.remove(sock.fileno())
        sock.close()

    def _note_tx(self, at: float, source: str) -> None:
        box = self.box
        if box is not None:
            box.tx_at, box.tx_source = at, source

    # ---- asyncio.Transport, as uvicorn uses it
    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` (through the socket when nothing is queued in the loop's transport)."""
        sock = self.sock
        if sock is None or self._real.get_write_buffer_size():
            self._real.write(data)
            self._note_tx(time.time(), "loop")
            return
        try:
            n = sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            self._real.write(data)  # the loop's transport reports the broken connection
            return
        self._tx_bytes += n
        if n < len(data):
            self._real.write(data[n:])
            self._note_tx(time.time(), "loop")
            return
        if self._tx:
            stamp = kerneltime.tx_stamp(sock, self._tx_bytes - 1)
            if stamp is not None:
                self._note_tx(min(stamp, time.time()), "tx_timestamp")
                return
        self._note_tx(time.time(), "send_return")

    def writelines(self, data: list[bytes]) -> None:
        """``write(b"".join(data))``."""
        self.write(b"".join(data))

    def close(self) -> None:
        """Stop reading and close the connection once queued bytes are written."""
        self.drop()
        self._real.close()

    def abort(self) -> None:
        """Close the connection at once."""
        self.drop()
        self._real.abort()

    def is_closing(self) -> bool:
        """Whether the connection is closing or closed."""
        return self._real.is_closing()

    def pause_reading(self) -> None:
        """Stop reading (uvicorn's flow control)."""
        self._paused = True
        if self.sock is not None and self._poller is not None:
            self._poller.remove(self.sock.fileno())
        else:
            self._real.pause_reading()

    def resume_reading(self) -> None:
        """Read again."""
        self._paused = False
        if self.sock is not None and self._poller is not None:
            self._poller.add(self.sock.fileno(), self._readable)
        else:
            self._real.resume_reading()

    def is_reading(self) -> bool:
        """Whether reading is on."""
        return not self._paused

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """The loop's transport's extra info (socket, peername, sockname, sslcontext)."""
        return self._real.get_extra_info(name, default)

    def __getattr__(self, name: str) -> Any:  # set_protocol, write buffer limits, ...
        return getattr(self._real, name)


def protocol_class() -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with kernel-stamped reads and writes (module docstring).

    Returns:
        A subclass of ``uvicorn.protocols.http.httptools_impl.HttpToolsProtocol``, for
        ``uvicorn.Config(http=...)``.
    """
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class KernelStampedHttpToolsProtocol(HttpToolsProtocol):
        _stamped: _StampedTransport | None = None
        _box: Stamps | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._stamped = _StampedTransport(transport, self, self.loop)
            super().connection_made(cast(asyncio.Transport, self._stamped))

        def connection_lost(self, exc: Exception | None) -> None:
            if self._stamped is not None:
                self._stamped.drop()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            box = self._box = Stamps()
            cast(dict[str, Any], self.scope)[SCOPE_KEY] = box
            if self._stamped is not None:
                self._stamped.box = box

        def on_message_complete(self) -> None:
            box, st = self._box, self._stamped
            if box is not None and box.rx_at is None:
                if st is not None and st.sock is not None and st.rx_at is not None:
                    box.rx_at = st.rx_at
                    box.rx_source = "kernel" if st.rx_kernel else "loop"
                else:
                    box.rx_at, box.rx_source = time.time(), "loop"
            super().on_message_complete()

    return KernelStampedHttpToolsProtocol
