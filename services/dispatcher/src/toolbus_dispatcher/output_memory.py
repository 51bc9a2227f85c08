"""A bound on the memory that large outputs in flight hold (`TOOLBUS_DISPATCHER_OUTPUT_MEMORY`).

A call whose answer is large (over `LARGE_BODY` bytes: its declared length, or what it has read
so far when none is declared) reserves `COST` times the answer's size (the declared length, else
the output cap) before reading on, and holds it until its outcome is stored; a call whose
reservation does not fit waits (its socket is not read meanwhile, so the server waits too), first
come first served, and completes once others have stored theirs. An answer larger than the whole
bound reserves all of it, so it runs alone. Each call holds at most one reservation and never waits
while holding one, so calls waiting on each other cannot deadlock. Answers under `LARGE_BODY`
are not counted.
"""

from __future__ import annotations

import asyncio
import collections
import math

from toolbus_mcp_client import LARGE_BODY

COST = 3.0
"""Bytes of memory a large answer holds at its peak per byte of it: while it is parsed, its bytes,
the parser's working copy (orjson copies its input) and the parsed output; after, the output and
its JSON text for the object store (`bench/outputs_memory.py` measures it)."""

__all__ = ["COST", "LARGE_BODY", "Lease", "OutputMemory"]


class OutputMemory:
    """The bytes of memory large outputs may hold in all; `lease()` gives each call its share."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.peak = 0
        """The most reserved at once since start (for tests and benches)."""
        self.waits = 0
        """How many reservations had to wait (for tests and benches)."""
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def lease(self) -> Lease:
        return Lease(self)

    def cost(self, size: int) -> int:
        """What an answer of `size` bytes reserves: `COST` times it, at most the whole bound."""
        return min(self.capacity, math.ceil(size * COST))

    async def _acquire(self, amount: int) -> None:
        if not self._waiters and self.used + amount <= self.capacity:
            self._take(amount)
            return
        self.waits += 1
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (amount, waiter)
        self._waiters.append(entry)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(amount)  # granted just as it was cancelled: give it back
            else:
                self._waiters.remove(entry)
                self._wake()  # those behind it may fit now
            raise

    def _take(self, amount: int) -> None:
        self.used += amount
        self.peak = max(self.peak, self.used)

    def _release(self, amount: int) -> None:
        self.used -= amount
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.capacity:
            amount, waiter = self._waiters.popleft()
            self._take(amount)
            waiter.set_result(None)


class Lease:
    """One call's share of an `OutputMemory`: at most one reservation at a time, held until
    `release` (the runner's, once the outcome is stored); `reserve` is what readers call."""

    __slots__ = ("_held", "_memory", "closed")

    def __init__(self, memory: OutputMemory) -> None:
        self._memory = memory
        self._held = 0
        self.closed = False

    async def reserve(self, size: int) -> None:
        """Hold room for an answer of `size` bytes, waiting until it fits. A larger need than the
        one held gives the held one back first (it never waits while holding)."""
        amount = self._memory.cost(size)
        if amount <= self._held or self.closed:
            return
        self.release(close=False)
        await self._memory._acquire(amount)
        if self.closed:  # released while it waited: the call is over
            self._memory._release(amount)
            return
        self._held = amount

    def release(self, *, close: bool = True) -> None:
        """Give the reservation back; with `close`, later reservations are no-ops."""
        self.closed = self.closed or close
        if self._held:
            amount, self._held = self._held, 0
            self._memory._release(amount)
