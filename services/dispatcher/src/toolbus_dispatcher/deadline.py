"""`within(loop, seconds, awaitable)`: `asyncio.timeout` for one await of the current task, lean.

What `asyncio.timeout` (3.11, pure Python) does per use is a `Timeout` object, a `current_task()`
and a `get_running_loop()` (each a `getpid` system call in CPython's C accessor), a reschedule and
the state checks on the way out. An attempt of a call needs only: cancel the task when the time is
up, and tell that cancellation from any other. This is that: one `call_later` handle on the loop
the caller already holds, `uncancel` on the way out, `TimeoutError` when it was ours, as
`asyncio.timeout` raises it (a cancellation from elsewhere stays a cancellation).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(loop: asyncio.AbstractEventLoop, seconds: float, awaitable: Awaitable[T]) -> T:
    """Await `awaitable` in the current task; `TimeoutError` if it takes longer than `seconds`."""
    task = asyncio.current_task(loop)
    assert task is not None, "within() runs in a task"
    cancelling = task.cancelling()
    fired = False

    def expire() -> None:
        nonlocal fired
        fired = True
        task.cancel()

    handle = loop.call_later(seconds, expire)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if fired:
            fired = False  # uncancelled here, not again below
            if task.uncancel() <= cancelling:
                raise TimeoutError from None
        raise
    finally:
        handle.cancel()
        if fired:  # the time ran out, but the awaited code swallowed the cancellation
            task.uncancel()
