"""A harness and an approver talking to toolbus as the e2e approval tests need: the harness's
requests and run events on one connection, the approver's `approval.requested` events,
decisions and history on another, each as its own NATS role."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from toolbus_contracts import Subjects

from tests.support.bus_modes import Bus
from tests.support.events import stored_events
from tests.support.infra import js_name, request, request_ok


class ApprovalClient:
    """Requests as the harness (`ok`) or the approver (`approver_ok`, `decide`, `history`), the
    approvals asked for, and a run's events."""

    def __init__(self, nc: Any, approver: Any, prefix: str) -> None:
        self.nc = nc
        self.approver = approver
        self.prefix = prefix
        self.subjects = Subjects(prefix)
        self.requested: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def ok(self, subject: str, body: dict[str, Any], within: float = 10.0) -> dict[str, Any]:
        """The harness's request; its reply's `data`, once the reply is `ok`."""
        return await request_ok(self.nc, subject, body, within)

    async def approver_ok(self, subject: str, body: dict[str, Any], within: float = 10.0) -> dict[str, Any]:
        """The approver's request; its reply's `data`, once the reply is `ok`."""
        return await request_ok(self.approver, subject, body, within)

    async def decide(self, body: dict[str, Any]) -> dict[str, Any]:
        """The approver's `approvals.decide` reply, whatever it is."""
        return await request(self.approver, self.subjects.approvals_decide, body, timeout=10)

    async def history(self, **filters: Any) -> dict[str, Any]:
        return await self.approver_ok(self.subjects.approvals_history, filters)

    async def on_requested(self, msg: Any) -> None:
        await self.requested.put(json.loads(msg.data))

    async def approval_for(self, call_id: str) -> dict[str, Any]:
        """The `approval.requested` event of `call_id` (others before it are passed over)."""
        while True:
            event = await asyncio.wait_for(self.requested.get(), 30)
            if event["callId"] == call_id:
                return event

    async def run_events(self, run_id: str) -> list[dict[str, Any]]:
        """Every event of the run now in the EVENTS stream, in order."""
        return await stored_events(self.nc, js_name(self.prefix, "EVENTS"), self.subjects.run_events(run_id))

    async def call_events(self, run_id: str, call_id: str, last: str) -> list[dict[str, Any]]:
        """The call's events, once its `last` event is in the stream (events are core NATS
        publishes captured by the stream, so the outcome may arrive a moment before them)."""
        kinds: list[str] = []
        for _ in range(400):
            events = [e for e in await self.run_events(run_id) if e["callId"] == call_id]
            kinds = [e["type"] for e in events]
            if kinds and kinds[-1] == last:
                return events
            await asyncio.sleep(0.025)
        raise AssertionError(f"call {call_id} never reached its {last} event: {kinds}")


@asynccontextmanager
async def approval_client(bus: Bus, redis_url: str, prefix: str) -> AsyncIterator[ApprovalClient]:
    """An `ApprovalClient` on `prefix`, subscribed to `approval.requested`; on exit the prefix's
    state is dropped and both connections drained."""
    nc = await bus.connect("harness")
    approver = await bus.connect("approver")
    client = ApprovalClient(nc, approver, prefix)
    sub = await approver.subscribe(client.subjects.approvals_requested, cb=client.on_requested)
    await approver.flush()
    try:
        yield client
    finally:
        await sub.unsubscribe()
        await bus.drop_state(nc, redis_url, prefix)
        await approver.drain()
        await nc.drain()
