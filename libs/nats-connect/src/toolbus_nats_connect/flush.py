"""A flush that covers what nats-py has not written yet."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient


async def flush(nc: NatsClient) -> None:
    """`nc.flush()` that also covers the SUB and PUB lines still in nats-py's pending buffer, so
    that once it returns the server has every subscription made before it.

    nats-py 2.16 writes flush()'s PING straight to the socket, while `subscribe()` and `publish()`
    append to a buffer its flusher task writes later: the PONG can come back before the server has
    a subscription made just before (measured: 43 of 2,000 `subscribe(); flush()` on one
    connection followed by a request on another got no responders, 0 of 2,000 with the buffer
    forced out first; `bench/nats_flush_race.py`). `_flush_pending(force_flush=True)` waits for
    the flusher to write it."""
    force = getattr(nc, "_flush_pending", None)
    if force is not None and nc.is_connected:
        await force(force_flush=True)
    await nc.flush()
