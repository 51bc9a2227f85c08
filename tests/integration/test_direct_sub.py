"""`subscribe_direct`: a nats-py subscription whose messages go straight from the client's reader
to a function, against a real NATS: every message arrives, in order, none is left pending, the
queue group still shares the messages, and unsubscribe and drain still work."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import pytest
from nats.aio.msg import Msg
from toolbus_common.private.direct_sub import spawner, subscribe_direct

from tests.support.infra import unique_prefix, until

pytestmark = pytest.mark.integration


async def test_messages_reach_the_function_in_order_and_none_stay_pending(nc: Any) -> None:
    subject = f"{unique_prefix()}.direct"
    seen: list[bytes] = []
    sub = await subscribe_direct(nc, subject, lambda msg: seen.append(msg.data))
    for i in range(200):
        await nc.publish(subject, str(i).encode())
    await nc.flush()
    await until(lambda: len(seen) == 200, "all 200 messages delivered")
    assert seen == [str(i).encode() for i in range(200)]
    assert sub.pending_msgs == 0 and sub._pending_size == 0
    await sub.unsubscribe()
    await nc.publish(subject, b"late")
    await nc.flush()
    await asyncio.sleep(0.05)
    assert len(seen) == 200


async def test_spawned_handlers_answer_requests_and_the_queue_group_shares_them(nats_url: str) -> None:
    subject = f"{unique_prefix()}.direct.q"
    servers = [await nats.connect(nats_url) for _ in range(2)]
    client = await nats.connect(nats_url)
    tasks: set[asyncio.Task[None]] = set()
    served: list[int] = []
    try:
        for index, server in enumerate(servers):

            async def answer(msg: Msg, index: int = index, server: Any = server) -> None:
                served.append(index)
                await asyncio.sleep(0)  # a handler that awaits: each runs in a task of its own
                await server.publish(msg.reply, msg.data.upper())

            await subscribe_direct(server, subject, spawner(tasks, answer), queue="q")
            await server.flush()
        replies = await asyncio.gather(
            *(client.request(subject, b"ping%d" % i, timeout=5) for i in range(40))
        )
        assert [r.data for r in replies] == [b"PING%d" % i for i in range(40)]
        assert len(served) == 40 and set(served) <= {0, 1}
        await until(lambda: not tasks, "the spawned tasks ended and were forgotten")
        await servers[0].drain()  # drain waits on the (never filled) pending queue: returns
    finally:
        for conn in (*servers, client):
            if not conn.is_closed:
                await conn.close()
