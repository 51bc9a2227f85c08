"""Call events on `events.calls.<runId>.<callId>`, captured by the `<P>_EVENTS` stream, that always
agree with the calls' state.

The Lua script that changes a call writes the change's event into a Redis stream, the outbox
(`Keys.call_events_outbox`), in the same atomic step (see `lua/admit.lua`). This relay moves
events from there to JetStream: it publishes each with `Nats-Msg-Id: <callId>:<n>` and waits for
JetStream's ack before it acknowledges and deletes the outbox entry. A crash or a NATS or Redis
outage between the two only means the entry is published again, and JetStream's duplicate window
(2 minutes by default) drops the second copy. So after any crash or restart each call's events
are in the stream exactly once, ending with the outcome `calls.get` shows.

Every replica runs a relay in the consumer group `relay`; an entry is read by one of them, and the
entries of a replica that died unacknowledged are claimed by another after `CLAIM_IDLE` seconds.
Events of one batch are published in order, pipelined; an entry is deleted only once its ack came.
Acks come to one inbox subscription of the relay's (not a request and a task per event, as
`JetStreamContext.publish` does: that costs more than the rest of a call's dispatching).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from redis.asyncio import Redis
from redis.exceptions import ResponseError

log = logging.getLogger(__name__)

GROUP = "relay"
BATCH = 512
CLAIM_IDLE = 10.0
"""Seconds an entry read by another replica may stay unacknowledged before this one takes it."""
ACK_WAIT = 5.0
"""Seconds a batch waits for JetStream's acks; entries without one are sent again."""


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class EventRelay:
    """Publishes outbox entries to JetStream, once each (per message id), in order per batch."""

    def __init__(
        self,
        redis: Redis[bytes],
        nc: NatsClient,
        outbox: str,
        consumer: str,
        *,
        block_ms: int = 1000,
        retry_pause: float = 0.2,
    ) -> None:
        self._r = redis
        self._nc = nc
        self._outbox = outbox
        self._inbox = nc.new_inbox()  # under TOOLBUS_NATS_INBOX_PREFIX, which its user may subscribe to
        self._acks: dict[str, asyncio.Future[bool]] = {}
        self._seq = itertools.count()
        self._sub: Subscription | None = None
        self._consumer = consumer
        self._block = block_ms
        self._pause = retry_pause
        self.relayed = 0

    async def _on_ack(self, msg: Msg) -> None:
        future = self._acks.pop(msg.subject, None)
        if future is None or future.done():
            return
        data = msg.data
        # A PubAck (`{"stream":..,"seq":..}`, `"duplicate":true` for a copy already stored) is a
        # success; an error reply or a status message (503: no stream captures it) is not.
        future.set_result(bool(data) and data.startswith(b"{") and b'"error"' not in data)

    async def _subscribe(self) -> None:
        if self._sub is None:
            self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_ack)

    async def _ensure_group(self) -> None:
        try:
            await self._r.xgroup_create(self._outbox, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def run(self) -> None:
        """Relay until cancelled; outages are waited out (entries stay in the outbox meanwhile)."""
        backlog = True  # start with entries this consumer read before and never acknowledged
        pause = self._pause
        claim_at = 0.0
        loop = asyncio.get_running_loop()
        grouped = False
        while True:
            try:
                if not grouped:
                    await self._subscribe()
                    await self._ensure_group()
                    grouped = True
                if loop.time() >= claim_at:
                    claim_at = loop.time() + CLAIM_IDLE / 2
                    if await self._claim_stale():
                        backlog = True
                entries = await self._read(backlog)
                if backlog and not entries:
                    backlog = False
                    continue
                if entries and not await self._publish(entries):
                    backlog = True
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 5.0)
                    continue
                pause = self._pause
            except asyncio.CancelledError:
                raise
            except ResponseError as exc:
                if "NOGROUP" in str(exc):  # Redis lost the group (restarted without its data)
                    grouped = False
                    continue
                log.warning("event relay: Redis refused a command", extra={"error": str(exc)[:200]})
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)
            except Exception as exc:
                log.warning("event relay: waiting for Redis", extra={"error": type(exc).__name__})
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)

    async def _read(self, backlog: bool, *, block: bool = True) -> list[tuple[bytes, dict[bytes, bytes]]]:
        res = await self._r.xreadgroup(
            GROUP,
            self._consumer,
            {self._outbox: "0" if backlog else ">"},
            count=BATCH,
            block=None if backlog or not block else self._block,
        )
        if not res:
            return []
        _, entries = res[0]
        return [(eid, fields) for eid, fields in entries if fields]

    async def _claim_stale(self) -> bool:
        """Take over entries another (dead) replica read and never acknowledged."""
        res = await self._r.xautoclaim(
            self._outbox, GROUP, self._consumer, int(CLAIM_IDLE * 1000), start_id="0-0", count=BATCH
        )
        claimed = res[1] if len(res) > 1 else []
        return bool(claimed)

    async def _publish(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> bool:
        """Publish a batch in order; acknowledge and delete what JetStream acked. False when some
        entry failed (it stays pending and is published again)."""
        await self._subscribe()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[bool]] = []
        error: BaseException | None = None
        for _, fields in entries:
            reply = f"{self._inbox}.{next(self._seq)}"
            future: asyncio.Future[bool] = loop.create_future()
            self._acks[reply] = future
            futures.append(future)
            try:
                await self._nc.publish(
                    _s(fields[b"s"]), fields[b"b"], reply=reply, headers={"Nats-Msg-Id": _s(fields[b"i"])}
                )
            except Exception as exc:  # disconnected with a full buffer, closed: the rest waits
                error = exc
                future.set_result(False)
                break
        if futures:
            await asyncio.wait(futures, timeout=ACK_WAIT)
        results = [f.done() and f.result() for f in futures]
        for future in futures:
            if not future.done():
                future.cancel()
        for reply in [r for r, f in self._acks.items() if f.done()]:
            del self._acks[reply]
        done = [eid for (eid, _), ok in zip(entries, results, strict=False) if ok]
        if done:
            async with self._r.pipeline(transaction=False) as pipe:
                pipe.xack(self._outbox, GROUP, *done)
                pipe.xdel(self._outbox, *done)
                await pipe.execute()
            self.relayed += len(done)
        failed = len(entries) - len(done)
        if failed:
            log.warning(
                "event relay: JetStream did not take some events; they are sent again",
                extra={"failed": failed, "error": type(error).__name__ if error else "no ack"},
            )
        return failed == 0

    async def drain(self, within: float) -> None:
        """On shutdown (the relay loop stopped): relay what the outbox holds, for up to `within`
        seconds; what is left waits for the next relay (another replica, or this one restarted)."""
        try:
            async with asyncio.timeout(within):
                backlog = True
                while True:
                    entries = await self._read(backlog, block=False)
                    if not entries:
                        if not backlog:
                            return
                        backlog = False
                        continue
                    if not await self._publish(entries):
                        return
        except Exception:
            log.warning("event relay: events left in the outbox at shutdown; the next relay sends them")

    async def pending(self) -> int:
        """Entries in the outbox not yet in JetStream (for tests and health)."""
        with contextlib.suppress(ResponseError):
            return int(await self._r.xlen(self._outbox))
        return 0
