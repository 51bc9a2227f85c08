"""Requests the gateway sends over NATS as a client of the registry and the dispatcher: the
contract's envelope unwrapped, an error reply raised as its `ToolbusError`, and `unavailable`
(or no service subscribed) sent again until the request's deadline where that is safe. A body
that cannot be sent (not JSON-encodable, nested too deep, over `max_payload`) is `InvalidRequest`."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import nats.errors
import orjson
from nats.aio.client import Client as NatsClient
from toolbus_contracts.errors import InvalidRequest, Timeout, ToolbusError, Unavailable, request_too_large


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
        payload = self.encode(subject, body)
        while True:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise Timeout(f"No reply on {subject} within {timeout:g}s.")
                try:
                    msg = await self._nc.request(subject, payload, timeout=left)
                except nats.errors.MaxPayloadError:  # the size checked in `encode`, plus headers
                    raise request_too_large(subject, len(payload), self._nc.max_payload) from None
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

    def encode(self, subject: str, body: dict[str, Any]) -> bytes:
        """The request's bytes, or `InvalidRequest` when it cannot be sent: nothing is sent then."""
        try:
            payload = orjson.dumps(body)
        except Exception as exc:  # orjson's recursion limit, a value JSON has no form for
            raise InvalidRequest(
                f"The request on {subject} cannot be sent as JSON: {_reason(exc)}.",
                details={"field": "body"},
            ) from None
        if len(payload) > self._nc.max_payload > 0:
            raise request_too_large(subject, len(payload), self._nc.max_payload)
        return payload


def _reason(exc: Exception) -> str:
    text = str(exc).rstrip(".")
    if "recursion" in text.lower():
        return "it is nested too deeply (JSON here takes at most 255 levels, the request envelope included)"
    return text[:200] or type(exc).__name__
