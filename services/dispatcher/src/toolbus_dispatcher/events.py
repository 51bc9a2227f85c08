"""Call events on `events.calls.<runId>.<callId>`: core NATS publishes on the dispatcher's one
connection (so they leave in order, with no ack wait), captured by the `<P>_EVENTS` stream."""

from __future__ import annotations

from typing import Any

import orjson
from nats.aio.client import Client as NatsClient
from toolbus_common.clock import now_iso
from toolbus_contracts import Subjects


class CallEvents:
    """Publishes `CallEvent` bodies (`{"type", "callId", "runId", "at", ...}`)."""

    def __init__(self, nc: NatsClient, subjects: Subjects) -> None:
        self._nc = nc
        self._subjects = subjects

    async def publish(self, kind: str, run_id: str, call_id: str, **extra: Any) -> None:
        body: dict[str, Any] = {"type": kind, "callId": call_id, "runId": run_id, "at": now_iso()}
        for key, value in extra.items():
            if value is not None:
                body[key] = value
        await self._nc.publish(self._subjects.call_events(run_id, call_id), orjson.dumps(body))
