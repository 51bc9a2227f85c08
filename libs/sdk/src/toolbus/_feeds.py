"""Event feeds that are subscribed the moment they are made (not at the first `anext`, as an async
generator would be), so nothing published in between is missed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Generic, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from toolbus._connection import flush
from toolbus._core import Core
from toolbus._errors import Timeout, client_closed, closed_as_unavailable

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription


E = TypeVar("E", bound=BaseModel)
T = TypeVar("T")

CLOSED_CHECK_EVERY = 1.0
"""Seconds between looks, while a feed waits, at whether its client was closed: nats-py wakes no
callback subscription when the client is drained, so the wait would otherwise never end."""


async def next_unless_closed(queue: asyncio.Queue[T], nc: NatsClient, subject: str) -> T:
    """The queue's next item; `Unavailable` (`details.closed`) once the client is closed."""
    while not nc.is_closed:
        try:
            # Not wait_for: on Python 3.11 it runs the get in a task of its own and can swallow a
            # cancellation that comes with an item (the item stays queued either way).
            async with asyncio.timeout(CLOSED_CHECK_EVERY):
                return await queue.get()
        except TimeoutError:
            continue
    raise client_closed(subject)


class Feed(Generic[E]):
    """Events of one subject as they are published from now on: `await feed.next(timeout)`,
    `async for event in feed`, `await feed.close()` (or `async with`)."""

    def __init__(self, model: type[E], keep: Callable[[E], bool], nc: NatsClient, subject: str) -> None:
        self._model = model
        self._keep = keep
        self._queue: asyncio.Queue[E] = asyncio.Queue()
        self._sub: Subscription | None = None
        self._nc = nc
        self._subject = subject

    @classmethod
    async def open(cls, tb: Core, subject: str, model: type[E], keep: Callable[[E], bool]) -> Feed[E]:
        feed = cls(model, keep, tb.nc, subject)
        with closed_as_unavailable(subject):
            feed._sub = await tb.nc.subscribe(subject, cb=feed._on_msg)
            await flush(tb.nc)
        return feed

    async def _on_msg(self, msg: Msg) -> None:
        with contextlib.suppress(ValueError, ValidationError):
            event = self._model.model_validate(orjson.loads(msg.data))
            if self._keep(event):
                self._queue.put_nowait(event)

    async def next(self, timeout: float | None = None) -> E:
        """The next event; `Timeout` when none comes within `timeout` seconds."""
        try:
            async with asyncio.timeout(timeout):
                return await next_unless_closed(self._queue, self._nc, self._subject)
        except TimeoutError:
            raise Timeout(f"No {self._model.__name__} event within {timeout:g}s.") from None

    def __aiter__(self) -> Feed[E]:
        return self

    async def __anext__(self) -> E:
        return await self.next()

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def __aenter__(self) -> Feed[E]:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
