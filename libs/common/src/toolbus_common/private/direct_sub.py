"""A nats-py subscription whose messages are handed to a plain function as they are parsed.

nats-py delivers a callback subscription's messages through an `asyncio.Queue` read by a task of
the subscription's own (`Subscription._wait_for_msgs`), which awaits the callback one message at
a time: for a callback that only starts a task per message (the bus's raw hot-path routes), that
is a queue put, a task wake-up, a queue get and a callback coroutine per message for nothing.
`subscribe_direct` subscribes as usual, then puts `_Handoff` in the place of the queue: the
client's reader (`Client._process_msg`, which only ever calls `put_nowait` on it) hands each
message straight to `deliver`, in the order received, and the subscription's own task is
stopped. `deliver` must not block (it starts a task, or sets a future).

nats-py is pinned (uv.lock); the attributes used here are what `Client._process_msg`,
`Subscription._drain` and `Subscription.pending_msgs` touch, and tests/integration/test_direct_sub.py
runs it against a real server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

Deliver = Callable[[Msg], None]


class _Handoff:
    """Stands in for a subscription's pending queue: nothing ever waits in it."""

    __slots__ = ("_deliver", "_sub")

    def __init__(self, sub: Subscription, deliver: Deliver) -> None:
        self._sub = sub
        self._deliver = deliver

    def put_nowait(self, msg: Msg) -> None:
        # `_process_msg` added the message's size to the pending bytes before handing it here.
        self._sub._pending_size -= len(msg.data)
        self._deliver(msg)

    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    def task_done(self) -> None:
        return None

    async def join(self) -> None:
        return None


async def subscribe_direct(
    nc: NatsClient, subject: str, deliver: Deliver, *, queue: str = ""
) -> Subscription:
    """Subscribe `deliver` to `subject` (in queue group `queue`); see the module doc."""

    async def unused(_msg: Msg) -> None:  # nats-py requires a coroutine callback to start the sub
        return None

    sub = await nc.subscribe(subject, queue=queue, cb=unused)
    task = sub._wait_for_msgs_task
    sub._pending_queue = _Handoff(sub, deliver)  # type: ignore[assignment]
    if task is not None:
        task.cancel()  # it waits on the old (empty) queue, which nothing feeds any more
        sub._wait_for_msgs_task = None
    return sub


def spawner(tasks: set[asyncio.Task[None]], handle: Callable[[Msg], Coroutine[Any, Any, None]]) -> Deliver:
    """A `Deliver` that runs the coroutine `handle(msg)` in a task of its own, kept in `tasks`
    until it ends (so a slow message never holds up the next, and a drain can wait for them)."""
    loop = asyncio.get_running_loop()
    discard = tasks.discard

    def deliver(msg: Msg) -> None:
        task = loop.create_task(handle(msg))
        tasks.add(task)
        task.add_done_callback(discard)

    return deliver
