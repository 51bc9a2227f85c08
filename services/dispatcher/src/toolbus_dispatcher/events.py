"""Call events on `events.calls.<runId>.<callId>`: core NATS publishes on the dispatcher's one
connection (so they leave in order, with no ack wait), captured by the `<P>_EVENTS` stream.

Events linger in a buffer for at most `linger` seconds (5 ms by default) or until an event
published with `now=True` (a call's `completed`) flushes them all, in order. On this hot path a
socket write costs more than everything else the dispatcher does for a call, and a short call's
`accepted`, `attemptStarted`, `completed` and its invoke reply then leave in one write. The
call's state in Redis, not the event stream, is the source of truth; a dispatcher killed within
the linger loses at most those few milliseconds of events.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from nats.aio.client import Client as NatsClient
from toolbus_common.clock import now_iso
from toolbus_contracts import Subjects

log = logging.getLogger(__name__)


class CallEvents:
    """Publishes `CallEvent` bodies (`{"type", "callId", "runId", "at", ...}`) in order."""

    def __init__(self, nc: NatsClient, subjects: Subjects, *, linger: float = 0.005) -> None:
        self._nc = nc
        self._subjects = subjects
        self._linger = linger
        self._buffer: list[tuple[str, bytes]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: set[asyncio.Task[None]] = set()

    async def publish(self, kind: str, run_id: str, call_id: str, *, now: bool = False, **extra: Any) -> None:
        """Queue one event; with `now`, send it and everything queued before it at once."""
        body: dict[str, Any] = {"type": kind, "callId": call_id, "runId": run_id, "at": now_iso()}
        for key, value in extra.items():
            if value is not None:
                body[key] = value
        self._buffer.append((self._subjects.call_events(run_id, call_id), orjson.dumps(body)))
        if now or self._linger <= 0:
            await self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._linger, self._flush_later)

    def _flush_later(self) -> None:
        self._timer = None
        task = asyncio.get_running_loop().create_task(self.flush())
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        buffer, self._buffer = self._buffer, []
        for subject, body in buffer:
            try:
                await self._nc.publish(subject, body)
            except Exception:
                log.exception("could not publish a call event", extra={"subject": subject})
