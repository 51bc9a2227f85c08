"""Stopping background loops reliably."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)


async def cancel_and_wait(task: asyncio.Task[Any], *, timeout: float = 10.0) -> None:  # noqa: ASYNC109
    """Cancel a background task and wait until it has ended, for up to `timeout` seconds.

    One `cancel()` is not always enough: on Python 3.11 `asyncio.wait_for` can return a result that
    completed just as it was cancelled, and some clients catch `CancelledError`, so a loop may take
    the cancellation, carry on to its next sleep and never end (a stop that hangs). This cancels
    again until the task is done. Its exception, if any, is retrieved (and logged), never raised.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not task.done():
        left = deadline - loop.time()
        if left <= 0:
            log.warning("a background task did not stop", extra={"task": task.get_name()})
            return
        task.cancel()
        await asyncio.wait({task}, timeout=min(0.2, left))
    if not task.cancelled() and task.exception() is not None:
        log.error("a background task had failed", exc_info=task.exception(), extra={"task": task.get_name()})
