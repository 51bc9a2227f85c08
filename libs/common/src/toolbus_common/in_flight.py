"""Work a process has in flight, counted, with a bounded wait until none is.

The dispatcher counts the `calls.invoke` requests it serves, so that its event relay publishes a
quiet call's events after the call rather than during it (`toolbus_dispatcher.events`); the
registry counts the searches it answers, so that a toolset's embedding and rendering start after
them (`toolbus_registry.searching`).
"""

from __future__ import annotations

import asyncio
import time


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class InFlight:
    """A count of requests being served (`enter`, `leave`), and `idle`, a wait for it to be zero."""

    __slots__ = ("_count", "_idle", "entered")

    def __init__(self) -> None:
        self._count = 0
        self._idle: asyncio.Future[None] | None = None
        self.entered = 0.0
        """When the newest came in (`time.monotonic`; `since_entered` reads it on the same clock)."""

    def enter(self) -> None:
        self._count += 1
        self.entered = time.monotonic()

    def leave(self) -> None:
        self._count -= 1
        if not self._count and self._idle is not None:
            _wake(self._idle)

    @property
    def busy(self) -> bool:
        return self._count > 0

    def since_entered(self) -> float:
        """Seconds since the newest came in, on the clock `enter` read (not the event loop's:
        uvloop's `loop.time()` is cached per loop turn, in whole milliseconds)."""
        return time.monotonic() - self.entered

    async def idle(self, within: float, loop: asyncio.AbstractEventLoop) -> None:
        """Return once none is in flight, or after `within` seconds (at once when `within` is not
        above zero)."""
        if not self._count or within <= 0:
            return
        if self._idle is None or self._idle.done():
            self._idle = loop.create_future()
        idle = self._idle
        timer = loop.call_later(within, _wake, idle)
        try:
            await asyncio.shield(idle)  # one waiter cancelled leaves the others waiting
        finally:
            timer.cancel()
