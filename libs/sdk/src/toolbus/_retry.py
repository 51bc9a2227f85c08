"""Sending a request again after a retryable `Unavailable`, with exponential backoff and jitter,
until the request's own timeout is spent (then the last `Unavailable` is raised).

Hand-written rather than `tenacity`/`backoff`: the loop must hand each attempt the
time left of one deadline and must tell a later attempt that an earlier one was answered
`unavailable` (see `Approvals.decide`), which those libraries' decorators do not give; the SDK
keeps its dependencies to nats-py, pydantic and the CLI's.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from toolbus._errors import Unavailable

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """The waits between attempts: `first` seconds, multiplied by `factor` after each, at most
    `cap`; each wait is drawn uniformly from its upper half ("equal jitter": [d/2, d]), so clients
    cut off together do not come back together."""

    first: float = 0.1
    factor: float = 2.0
    cap: float = 2.0

    def delays(self, rand: Callable[[], float] = random.random) -> Iterator[float]:
        """The waits, one per retry, without end (`rand()` in [0, 1))."""
        delay = self.first
        while True:
            yield delay / 2 + rand() * delay / 2
            delay = min(delay * self.factor, self.cap)


async def until_deadline(
    send: Callable[[float, bool], Awaitable[T]],
    wait: float,
    backoff: Backoff | None,
    *,
    give_up: Callable[[Unavailable, float], bool] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    rand: Callable[[], float] = random.random,
) -> T:
    """`await send(seconds_left, retried)` until it returns; an `Unavailable` with `retryable`
    set is waited out (the next backoff delay) and sent again while the next attempt would start
    before `wait` seconds are spent, else raised. `retried` tells an attempt that an earlier one
    was answered `unavailable`. `backoff=None`: one attempt. `give_up(exc, seconds_spent)` true:
    raise this `Unavailable` now (a kind not worth waiting out as long)."""
    started = clock()
    deadline = started + wait
    delays = backoff.delays(rand) if backoff is not None else None
    retried = False
    while True:
        try:
            return await send(max(deadline - clock(), 0.001), retried)
        except Unavailable as exc:
            if delays is None or not exc.retryable:
                raise
            if give_up is not None and give_up(exc, clock() - started):
                raise
            delay = next(delays)
            if clock() + delay >= deadline:
                raise
            await sleep(delay)
            retried = True
