"""The `calls.invoke` requests this process is serving, so that the event relay can publish a
call's events after its reply rather than during it.

On a quiet dispatcher a call's own `create_call` script wakes the relay (its `XADD`s end the
relay's blocking read), and the relay's publishing and acks then share the event loop with the
call's MCP request, its `finish_call` script and its reply. `EventRelay` waits, for a small batch,
until no invoke is in flight here, at most until `DEFER` seconds after the newest came in
(`idle`); a call that takes longer has its events published meanwhile, as before. Under load the relay's batches are larger and it
lingers instead (`events.LINGER`), so this changes nothing there.
"""

from __future__ import annotations

import asyncio
import time

DEFER = 0.002
"""Longest wait of the relay for the invokes in flight (seconds): a quiet call's MCP request, its
second script and its reply take ~1-1.5 ms here; a slower call's events go out meanwhile."""


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class InvokesInFlight:
    """A count of the `calls.invoke` requests being served, with a wait for it to reach zero."""

    __slots__ = ("_count", "_entered", "_idle")

    def __init__(self) -> None:
        self._count = 0
        self._entered = 0.0
        """When the newest invoke came in (`time.monotonic`, the event loop's clock)."""
        self._idle: asyncio.Future[None] | None = None

    def enter(self) -> None:
        self._count += 1
        self._entered = time.monotonic()

    def leave(self) -> None:
        self._count -= 1
        if not self._count and self._idle is not None:
            _wake(self._idle)

    @property
    def busy(self) -> bool:
        return self._count > 0

    async def idle(self, within: float, loop: asyncio.AbstractEventLoop) -> None:
        """Return once no invoke is in flight, or `within` seconds after the newest came in: the
        events that woke the relay are those of a call that just started; one that has run
        longer (a slow tool) is not waited for."""
        left = within - (loop.time() - self._entered)
        if not self._count or left <= 0:
            return
        if self._idle is None or self._idle.done():
            self._idle = loop.create_future()
        idle = self._idle
        timer = loop.call_later(left, _wake, idle)
        try:
            await asyncio.shield(idle)  # one waiter cancelled leaves the others waiting
        finally:
            timer.cancel()
