"""A durable JetStream pull consumer that hands each message to one async function and acks it
only after that function returned, so a crash mid-way means a redelivery, never a loss."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from toolbus_common.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class PoisonMessage(Exception):
    """The message can never be handled (malformed): it is terminated, not redelivered."""


MessageHandler = Callable[[bytes], Awaitable[None]]


class DurableConsumer:
    """Pulls `subject` from `stream` under the durable name `durable` (shared by every replica, so
    each message goes to one of them). A handler failure naks the message for a retry after
    `retry_delay`; `PoisonMessage` terminates it."""

    def __init__(
        self,
        js: JetStreamContext,
        *,
        stream: str,
        subject: str,
        durable: str,
        handle: MessageHandler,
        batch: int = 16,
        ack_wait: float = 30.0,
        retry_delay: float = 1.0,
    ) -> None:
        self._js = js
        self._stream = stream
        self._subject = subject
        self._durable = durable
        self._handle = handle
        self._batch = batch
        self._ack_wait = ack_wait
        self._retry_delay = retry_delay
        self._sub: JetStreamContext.PullSubscription | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        config = ConsumerConfig(
            durable_name=self._durable,
            filter_subject=self._subject,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=self._ack_wait,
            max_deliver=-1,
        )
        self._sub = await self._js.pull_subscribe(
            self._subject, durable=self._durable, stream=self._stream, config=config
        )
        self._task = asyncio.create_task(self._loop(), name=f"consumer-{self._durable}")

    async def stop(self) -> None:
        """Stop pulling (the durable consumer stays on the server); unacked messages are redelivered."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _loop(self) -> None:
        assert self._sub is not None
        while True:
            try:
                msgs = await self._sub.fetch(self._batch, timeout=1.0)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # connection lost, server restarting: wait and pull again
                log.warning("fetch failed", extra={"consumer": self._durable, "error": type(exc).__name__})
                await asyncio.sleep(self._retry_delay)
                continue
            for msg in msgs:
                try:
                    await self._handle(msg.data)
                except PoisonMessage as exc:
                    log.error("message dropped", extra={"consumer": self._durable, "reason": str(exc)})
                    with contextlib.suppress(Exception):
                        await msg.term()
                    continue
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("message failed, will retry", extra={"consumer": self._durable})
                    with contextlib.suppress(Exception):
                        await msg.nak(delay=self._retry_delay)
                    continue
                with contextlib.suppress(Exception):  # unacked: redelivered, and handlers are idempotent
                    await msg.ack()
