"""Live updates for the console: one subscription per process to the events an approval's life
shows up in (`events.approvals.requested`, and the calls' `approved`/`denied` events, then their
`completed`), fanned out to each open page's queue; the page then reloads its list (filtered for
the person) from the server. A page that opens moments after a call it decided completed (the
decision's own redirect) is told of that completion still (`REPLAY_SECONDS`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson
from nats.aio.client import Client as NatsClient
from toolbus_common.lru import Lru
from toolbus_contracts import Subjects

log = logging.getLogger(__name__)

QUEUE_SIZE = 64
"""Updates one page may have waiting; past that it misses some, and reloads on the next anyway."""
REPLAY_SECONDS = 10.0
"""How long a call's completion is told again to pages that open after it."""
DECIDED_CALLS = 4096
"""Calls decided lately whose completion is awaited (call id -> its approval's scope)."""


@dataclass(frozen=True, slots=True)
class Update:
    """Something changed about an approval: `requested` (new), `approved`/`denied`, or the
    decided call `completed` (with `status`: `ok`, or `error: <code>`)."""

    kind: str
    approval_id: str
    toolset_id: str | None
    namespace: str | None
    tool: str
    status: str | None = None


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
        self._decided: Lru[str, Update] = Lru(DECIDED_CALLS)
        self._completed: deque[tuple[float, Update]] = deque(maxlen=QUEUE_SIZE)

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
        """A page's queue, holding already the completions of the last `REPLAY_SECONDS`."""
        queue: asyncio.Queue[Update | None] = asyncio.Queue(QUEUE_SIZE)
        since = time.monotonic() - REPLAY_SECONDS
        for at, update in self._completed:
            if at >= since:
                _offer(queue, update)
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
            kind, call_id = body.get("type"), str(body.get("callId"))
        except (orjson.JSONDecodeError, AttributeError):
            return
        if kind == "completed":
            decided = self._decided.get(call_id)
            if decided is not None:
                update = replace(decided, kind="completed", status=_status(body.get("outcome")))
                self._completed.append((time.monotonic(), update))
                self._send(update)
            return
        approval_id = body.get("approvalId")
        if kind not in ("approved", "denied") or not isinstance(approval_id, str):
            return
        try:
            scope = await self._scope(approval_id)
        except Exception as exc:  # Redis briefly away: the pages miss this one
            log.warning("console: approval not read for a live update", extra={"error": type(exc).__name__})
            return
        if scope is not None:
            update = Update(kind, approval_id, *scope)
            self._decided.put(call_id, update)
            self._send(update)


def _status(outcome: Any) -> str:
    if not isinstance(outcome, dict) or outcome.get("status") == "ok":
        return "ok"
    error = outcome.get("error")
    return f"error: {error.get('code')}" if isinstance(error, dict) else "error"


def _offer(queue: asyncio.Queue[Update | None], update: Update | None) -> None:
    with contextlib.suppress(asyncio.QueueFull):
        queue.put_nowait(update)
