"""Durable JetStream pull consumers of the internal commands this service applies.

A command is acked only after it has been applied, so one sent while the service is down, or in
flight when it dies, is applied when it is back. A body that does not parse is logged and
terminated (never redelivered); a failure while applying is retried after a short delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from toolbus_common.tasks import cancel_and_wait
from toolbus_contracts import ToolbusError, parse_body
from toolbus_contracts.base import WireModel

log = logging.getLogger(__name__)

M = TypeVar("M", bound=WireModel)


class CommandConsumer:
    """Applies the messages of one subject, in order, one at a time."""

    def __init__(
        self,
        js: JetStreamContext,
        *,
        stream: str,
        subject: str,
        durable: str,
        model: type[M],
        apply: Callable[[M], Awaitable[None]],
        batch: int = 32,
        ack_wait: float = 30.0,
    ) -> None:
        self._js = js
        self._stream = stream
        self._subject = subject
        self._durable = durable
        self._model: type[WireModel] = model
        self._apply: Callable[[WireModel], Awaitable[None]] = apply  # type: ignore[assignment]
        self._batch = batch
        self._ack_wait = ack_wait
        self._task: asyncio.Task[None] | None = None
        self._sub: JetStreamContext.PullSubscription | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        sub = await self._js.pull_subscribe(
            self._subject,
            durable=self._durable,
            stream=self._stream,
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=self._ack_wait,
                max_deliver=-1,
            ),
        )
        self._sub = sub
        self._task = asyncio.create_task(self._loop(sub), name=f"consumer-{self._durable}")

    async def stop(self, grace: float = 5.0) -> None:
        self._stopping.set()
        if self._task is None:
            return
        await asyncio.wait({self._task}, timeout=grace)
        await cancel_and_wait(self._task)
        self._task = None
        if self._sub is not None:
            # Unsubscribe before the connection drains: draining a pull subscription waits on
            # its internal queue, which fetch() never marks done (nats-py 2.x), and hangs.
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _loop(self, sub: JetStreamContext.PullSubscription) -> None:
        while not self._stopping.is_set():
            try:
                msgs = await sub.fetch(self._batch, timeout=0.5)
            except (TimeoutError, NatsTimeout):
                continue
            except Exception:
                log.exception("fetch failed", extra={"consumer": self._durable})
                await asyncio.sleep(0.5)
                continue
            for msg in msgs:
                try:
                    message = parse_body(self._model, msg.data)
                except ToolbusError as exc:
                    log.error(
                        "command dropped: bad body", extra={"consumer": self._durable, "error": exc.message}
                    )
                    await msg.term()
                    continue
                try:
                    await self._apply(message)
                except Exception:
                    log.exception("command failed; will retry", extra={"consumer": self._durable})
                    await msg.nak(delay=1.0)
                    continue
                await msg.ack()
