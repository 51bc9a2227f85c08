"""A dependency's outage as one process sees it, logged as two lines instead of one per failure.

The first failure that meets Redis away starts a probe (a PING every half second). If the probe
fails too, Redis is unreachable: one warning (`Redis unreachable`). Every request answered
`unavailable` meanwhile is counted, and when the probe gets an answer one line ends the outage
(`Redis reachable again`, with the count and how long it was away). A failure the first probe
contradicts (one connection dropped, Redis answering) is one info line, not an outage. What
meets the outage in between logs nothing more, and never a traceback: a traceback is for a bug.
The recovery line is a warning too, so that a level that shows the first line shows its end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from toolbus_common.faults import is_backing_store_fault, is_redis_fault

log = logging.getLogger(__name__)

PROBE_PERIOD = 0.5
"""Seconds between probes while the dependency is away."""


class Outage:
    """One dependency's reachability: `fault` when an operation met it away, `answered_unavailable`
    for each request answered so meanwhile; a probe given to `watch` ends the outage."""

    def __init__(self, name: str, *, period: float = PROBE_PERIOD) -> None:
        self.name = name
        self.period = period
        self._probes: list[Callable[[], Awaitable[Any]]] = []
        self._probing: Callable[[], Awaitable[Any]] | None = None
        self._since: float | None = None
        self._unavailable = 0
        self._confirmed = False
        self._error = ""
        self._task: asyncio.Task[None] | None = None

    def watch(self, probe: Callable[[], Awaitable[Any]]) -> None:
        """A probe that tells it is back (a client's PING); the latest one still watched is asked."""
        self._probes.append(probe)

    async def forget(self, probe: Callable[[], Awaitable[Any]]) -> None:
        """Stop asking `probe`, whose client is closing: a PING after the close would connect it
        again, a connection nobody closes. A probe loop on it ends first (another client's
        takes over)."""
        if probe in self._probes:
            self._probes.remove(probe)
        task = self._task
        if task is None or task.done() or self._probing != probe:
            return
        if task.get_loop() is not asyncio.get_running_loop():
            return  # a loop that is gone (tests): it asks nothing more
        task.cancel()
        await asyncio.wait([task])
        self._task = None
        if self._since is not None and self._probes:
            self._task = asyncio.get_running_loop().create_task(self._wait_back(), name=f"{self.name}-probe")

    @property
    def down(self) -> bool:
        return self._since is not None

    def fault(self, exc: BaseException) -> None:
        """An operation failed because the dependency did not answer: the probe that tells an
        outage from a dropped connection starts (again, if an earlier one's loop has gone)."""
        if self._since is None:
            self._since = time.monotonic()
            self._unavailable = 0
            self._confirmed = False
            self._error = type(exc).__name__
        if not self._probes:
            self._confirm()  # nothing to ask: every failure that is news is an outage
            return
        if self._task is None or self._task.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # a synchronous caller: nothing to probe with
                self._confirm()
                return
            self._task = loop.create_task(self._wait_back(), name=f"{self.name}-probe")

    def answered_unavailable(self) -> None:
        self._unavailable += 1

    def _confirm(self) -> None:
        if self._since is None or self._confirmed:
            return
        self._confirmed = True
        log.warning(
            f"{self.name} unreachable; requests that need it are answered unavailable until it is back",
            extra={"store": self.name, "error": self._error},
        )

    def back(self) -> None:
        """The dependency answers again: the line that ends the outage (an info line if the
        probe never found it away)."""
        if self._since is None:
            return
        extra = {
            "store": self.name,
            "unavailableReplies": self._unavailable,
            "downSeconds": round(time.monotonic() - self._since, 1),
        }
        if self._confirmed:
            log.warning(f"{self.name} reachable again", extra=extra)
        else:
            log.info(
                f"a {self.name} connection failed; {self.name} answers", extra={**extra, "error": self._error}
            )
        self._since = None
        self._unavailable = 0
        self._confirmed = False

    async def _wait_back(self) -> None:
        while self._since is not None:
            if not self._probes:  # every watched client closed (the process stops): nothing to ask
                return
            probe = self._probing = self._probes[-1]
            await asyncio.sleep(self.period)
            try:
                async with asyncio.timeout(max(self.period * 4, 2.0)):
                    await probe()
            except Exception:  # away (or the probe's client is gone): an outage, probe again
                self._confirm()
                continue
            self.back()


REDIS = Outage("Redis")
"""This process's view of Redis (every client of `connect_redis` talks to the same one)."""


def expected_fault(exc: BaseException, what: str) -> bool:
    """Whether `exc` is an outage of a backing store rather than a bug: a Redis one is noted in
    `REDIS` (logged once per outage), another (NATS) is logged as one line without a traceback.
    False for anything else: the caller logs that with its traceback."""
    if not is_backing_store_fault(exc):
        return False
    if is_redis_fault(exc):
        REDIS.fault(exc)
    else:
        log.warning(f"{what}: a backing store did not answer", extra={"error": type(exc).__name__})
    return True
