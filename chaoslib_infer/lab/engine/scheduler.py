"""Continuous-batching admission: running slots plus a bounded FIFO wait queue."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass


@dataclass
class Ticket:
    """A request's place in the scheduler: granted a running slot, or waiting on ``fut``."""

    fut: asyncio.Future[None] | None = None
    granted: bool = False


class Scheduler:
    """Continuous-batching admission: ``max_running`` slots plus a bounded FIFO wait queue."""

    def __init__(self, max_running: int, max_waiting: int) -> None:
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.running = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    def try_admit(self) -> Ticket | None:
        """Take a slot or a queue place at once; ``None`` when the queue is full."""
        if self.running < self.max_running and not self.waiters:
            self.running += 1
            return Ticket(granted=True)
        if len(self.waiters) >= self.max_waiting:
            return None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        return Ticket(fut=fut)

    async def wait(self, ticket: Ticket) -> None:
        """Wait until ``ticket`` holds a running slot (cancellable)."""
        if ticket.granted or ticket.fut is None:
            return
        try:
            await ticket.fut
        except asyncio.CancelledError:
            if ticket.fut.done() and not ticket.fut.cancelled():
                ticket.granted = True  # granted just before the cancel: caller releases it
            raise
        ticket.granted = True

    def release(self, ticket: Ticket) -> None:
        """Give back the ticket's slot (or queue place) and start the next waiter."""
        fut = ticket.fut
        if not ticket.granted and fut is not None:
            if fut.done() and not fut.cancelled():
                ticket.granted = True  # a slot was handed to us but never picked up
            else:  # still queued (its future may be cancelled already)
                with contextlib.suppress(ValueError):
                    self.waiters.remove(fut)
                fut.cancel()
        if ticket.granted:
            ticket.granted = False
            self.running -= 1
        ticket.fut = None
        while self.waiters and self.running < self.max_running:
            fut = self.waiters.popleft()
            if fut.done():
                continue
            self.running += 1
            fut.set_result(None)
