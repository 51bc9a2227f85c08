"""Live updates for the console: one subscription per process to the events an approval's life
shows up in (`events.approvals.requested`, and the calls' `approved`/`denied` events), fanned out
to each open page's queue; the page then reloads its list (filtered for the person) from the server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from nats.aio.client import Client as NatsClient
from toolbus_contracts import Subjects

log = logging.getLogger(__name__)

QUEUE_SIZE = 64
"""Updates one page may have waiting; past that it misses some, and reloads on the next anyway."""


@dataclass(frozen=True, slots=True)
class Update:
    """Something changed about an approval: `requested` (new), or `approved`/`denied`."""

    kind: str
    approval_id: str
    toolset_id: str | None
    namespace: str | None
    tool: str


Scope = Callable[[str], Awaitable[tuple[str | None, str | None, str] | None]]
"""approval id -> (toolset id, namespace, tool) of a stored approval, or None."""


class LiveHub:
    """Subscribes once to the events subjects; `listen()` gives a page its own queue."""

    def __init__(self, nc: NatsClient, subjects: Subjects, scope: Scope) -> None:
        self._nc = nc
        self._subjects = subjects
        self._scope = scope
        self._queues: set[asyncio.Queue[Update | None]] = set()
        self._subs: list[Any] = []

    async def start(self) -> None:
        self._subs = [
            await self._nc.subscribe(self._subjects.approvals_requested, cb=self._on_requested),
            await self._nc.subscribe(self._subjects.run_events("*"), cb=self._on_call_event),
        ]

    async def stop(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):  # the connection closed first
                await sub.unsubscribe()
        for queue in list(self._queues):
            _offer(queue, None)  # ends the page's stream

    def listen(self) -> asyncio.Queue[Update | None]:
        queue: asyncio.Queue[Update | None] = asyncio.Queue(QUEUE_SIZE)
        self._queues.add(queue)
        return queue

    def forget(self, queue: asyncio.Queue[Update | None]) -> None:
        self._queues.discard(queue)

    def _send(self, update: Update) -> None:
        for queue in list(self._queues):
            _offer(queue, update)

    async def _on_requested(self, msg: Any) -> None:
        if msg.headers and "Nats-Stream" in msg.headers:
            return  # a stored copy handed out again, not the live event
        try:
            body = orjson.loads(msg.data)
            self._send(
                Update(
                    "requested",
                    str(body["approvalId"]),
                    body.get("toolsetId"),
                    body.get("namespace"),
                    str(body["tool"]),
                )
            )
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return

    async def _on_call_event(self, msg: Any) -> None:
        if msg.headers and "Nats-Stream" in msg.headers:
            return
        try:
            body = orjson.loads(msg.data)
            kind, approval_id = body.get("type"), body.get("approvalId")
        except (orjson.JSONDecodeError, AttributeError):
            return
        if kind not in ("approved", "denied") or not isinstance(approval_id, str) or not self._queues:
            return
        try:
            scope = await self._scope(approval_id)
        except Exception as exc:  # Redis briefly away: the pages miss this one
            log.warning("console: approval not read for a live update", extra={"error": type(exc).__name__})
            return
        if scope is not None:
            self._send(Update(kind, approval_id, *scope))


def _offer(queue: asyncio.Queue[Update | None], update: Update | None) -> None:
    with contextlib.suppress(asyncio.QueueFull):
        queue.put_nowait(update)
