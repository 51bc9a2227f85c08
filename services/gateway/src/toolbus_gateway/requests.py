"""Requests the gateway sends over NATS as a client of the registry and the dispatcher: the
contract's envelope unwrapped, an error reply raised as its `ToolbusError`, and `unavailable`
(or no service subscribed) sent again until the request's deadline where that is safe."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import nats.errors
import orjson
from nats.aio.client import Client as NatsClient
from toolbus_contracts.errors import Timeout, ToolbusError, Unavailable


class Requester:
    """`request(subject, body)` → the reply's `data`, or raise the reply's error."""

    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc

    async def request(
        self,
        subject: str,
        body: dict[str, Any],
        *,
        timeout: float = 30.0,  # noqa: ASYNC109 - the deadline of the reply, retries included
        retry: bool = True,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        wait = 0.1
        payload = orjson.dumps(body)
        while True:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise Timeout(f"No reply on {subject} within {timeout:g}s.")
                try:
                    msg = await self._nc.request(subject, payload, timeout=left)
                except nats.errors.NoRespondersError:
                    raise Unavailable(
                        f"No service answers {subject}.", details={"subject": subject}
                    ) from None
                except nats.errors.TimeoutError:
                    raise Timeout(f"No reply on {subject} within {timeout:g}s.") from None
                reply = orjson.loads(msg.data)
                if reply.get("ok") is True:
                    data: dict[str, Any] = reply.get("data") or {}
                    return data
                raise ToolbusError.from_wire(reply.get("error") or {})
            except Unavailable:
                if not retry or deadline - time.monotonic() <= wait:
                    raise
                await asyncio.sleep(wait * (0.5 + random.random() / 2))
                wait = min(wait * 2, 2.0)
