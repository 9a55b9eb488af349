"""The client's lazily re-armed attempt deadline (``attempts.Deadline``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from chaoslib_infer.load.attempts import Deadline as _Deadline


async def _sleep_under(
    deadline_after: float, moves: list[tuple[float, float]]
) -> tuple[bool, float]:
    """Sleep 1 s under a deadline ``deadline_after`` s from now, moving it per ``moves``
    (``(at, to)``: at ``at`` s, set it to ``to`` s from the start); returns (timed out, elapsed)."""
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    dl = _Deadline(loop, t0 + deadline_after)
    for at, to in moves:
        loop.call_later(at, dl.move, t0 + to)
    try:
        try:
            await asyncio.sleep(1.0)
        finally:
            expired = dl.close()
    except asyncio.CancelledError:
        if not expired:
            raise
        return True, time.perf_counter() - t0
    return False, time.perf_counter() - t0


def test_moved_later_fires_at_the_new_time_moved_earlier_at_once() -> None:
    later = asyncio.run(_sleep_under(0.05, [(0.02, 0.25), (0.1, 0.3)]))
    assert later[0] and 0.29 <= later[1] < 0.6
    earlier = asyncio.run(_sleep_under(0.5, [(0.02, 0.08)]))
    assert earlier[0] and 0.07 <= earlier[1] < 0.3
    untouched = asyncio.run(_sleep_under(5.0, []))
    assert untouched == (False, pytest.approx(1.0, abs=0.3))


def test_cancellation_from_outside_is_not_a_timeout() -> None:
    async def main() -> None:
        task = asyncio.create_task(_sleep_under(0.5, []))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
