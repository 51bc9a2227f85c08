"""Durable internal commands: one JetStream pull consumer per command route on the INTERNAL stream,
shared by every replica, with the one policy for what a command's outcome means.

A command no service signed is refused (terminated, never applied). Acked after the handler
returned; a body that does not parse, or a non-retryable `ToolbusError`, is dead-lettered
(`‹p›.internal.deadletter.<rest>`, kept in the same stream, headers say why) and terminated; a
backing-store fault or a retryable error is retried after `RETRY_DELAY`, without limit; any other
failure is retried with a growing delay and dead-lettered after `MAX_DELIVERIES`."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, NatsMessage, PullSub
from nats.js.api import AckPolicy as JsAckPolicy
from nats.js.api import ConsumerConfig, DeliverPolicy
from pydantic import BaseModel
from toolbus_contracts import ToolbusError, parse_body

from toolbus_common.faults import is_backing_store_fault, is_redis_fault
from toolbus_common.framework.metrics import COMMANDS
from toolbus_common.framework.routes import Entry
from toolbus_common.logging import Every
from toolbus_common.outages import REDIS
from toolbus_common.settings import Settings
from toolbus_common.signing import SIGNATURE_HEADER, CommandSigner

log = logging.getLogger("toolbus_common.bus")

INTERNAL_STREAM = "INTERNAL"
RETRY_DELAY = 1.0
"""Seconds before a command that met a backing-store fault is delivered again."""
MAX_DELIVERIES = 5
"""Deliveries of a command whose handler keeps failing (not a store fault) before it is dead-lettered."""
ACK_WAIT = 10.0
"""Seconds a delivered, unacknowledged command waits before JetStream delivers it again: how long
a command handed to a replica that died (its pull request was still waiting at the server) stays
unapplied. A handler running longer keeps its command by `in_progress` every third of it."""
PULL_TIMEOUT = 5.0
"""Seconds one pull request waits on the server; a command is handed over as soon as it is stored."""
UNSIGNED_LOG_EVERY = 60.0
"""Seconds between warnings of refused unsigned commands on one consumer."""
_UNSIGNED_LOGGED = Every(UNSIGNED_LOG_EVERY)


async def passthrough(msg: Any) -> Any:
    """FastStream decoder: hand the handler the FastStream message itself (the bus parses the body)."""
    return msg


def schema_signature(model: type[BaseModel], reply: type[BaseModel] | None) -> inspect.Signature:
    """The signature FastStream reads a subscriber's message and reply models from (AsyncAPI)."""
    param = inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=model)
    return inspect.Signature([param], return_annotation=reply)


def delivered(msg: NatsMessage) -> int:
    """How many times JetStream has delivered this message (1 without metadata)."""
    with contextlib.suppress(Exception):  # the in-memory test broker's messages carry no metadata
        return int(msg.raw_message.metadata.num_delivered)
    return 1


class Commands:
    """One service's command consumers and their retry, dead-letter and signature policy."""

    def __init__(
        self, settings: Settings, broker: NatsBroker, *, retry_delay: float, ack_wait: float
    ) -> None:
        self.settings = settings
        self.subjects = settings.subjects
        self.broker = broker
        self.stream = settings.js_name(INTERNAL_STREAM)
        self.retry_delay = retry_delay
        self.ack_wait = ack_wait
        self.signer: CommandSigner | None = None
        self.any = False

    def subscribe(self, broker: NatsBroker, entry: Entry, bound: Any, subject: str, title: str) -> None:
        """Declare the durable pull consumer of one command route on `broker`."""
        self.any = True
        if self.signer is None and self.settings.secret_key is not None:
            self.signer = CommandSigner(self.settings.secret_key)
        config = ConsumerConfig(
            durable_name=entry.durable,
            filter_subject=subject,
            ack_policy=JsAckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=self.ack_wait,
            max_deliver=-1,
        )
        broker.subscriber(
            subject,
            stream=JStream(self.stream, declare=False),
            durable=entry.durable,
            config=config,
            pull_sub=PullSub(batch_size=1, timeout=PULL_TIMEOUT),
            # FastStream would default to `_INBOX.`; a secured deployment only lets a service use its
            # own inbox prefix (TOOLBUS_NATS_INBOX_PREFIX), as nats-py does by default.
            inbox_prefix=f"{self.settings.nats_inbox_prefix}.".encode(),
            ack_policy=AckPolicy.MANUAL,
            decoder=passthrough,
            title=title,
            description=entry.description,
        )(self._consumer(entry, bound, subject))

    def require_signer(self) -> None:
        """A bus with command consumers needs `TOOLBUS_SECRET_KEY` (`ValueError` naming it)."""
        if self.any and self.signer is None:
            self.signer = CommandSigner.of(self.settings)

    def _consumer(self, entry: Entry, bound: Any, subject: str) -> Callable[[NatsMessage], Awaitable[None]]:
        assert entry.handler is not None
        apply = entry.handler
        durable = entry.durable

        async def consume(msg: NatsMessage) -> None:
            headers = getattr(msg.raw_message, "headers", None) or {}
            signer = self.signer
            if signer is None or not signer.verify(subject, msg.body, headers.get(SIGNATURE_HEADER)):
                await self._refuse_unsigned(msg, subject, durable)
                return
            try:
                command = parse_body(entry.model, msg.body)
            except ToolbusError as exc:
                await self._dead_letter(msg, subject, durable, f"{entry.model.__name__}: {exc.message}")
                return
            working = asyncio.ensure_future(self._working(msg))
            try:
                await apply(bound, command)
            except Exception as exc:
                await self._failed(msg, subject, durable, exc)
                return
            finally:
                working.cancel()
            COMMANDS.labels(subject, "applied").inc()
            with contextlib.suppress(Exception):  # unacked: redelivered, and every command is idempotent
                await msg.ack()

        consume.__signature__ = schema_signature(entry.model, None)  # type: ignore[attr-defined]
        consume.__name__ = getattr(apply, "__name__", "consume")
        return consume

    async def _refuse_unsigned(self, msg: NatsMessage, subject: str, durable: str) -> None:
        """A message on a command subject that no service signed: never applied, terminated (not
        delivered again), counted and logged (once a minute per consumer)."""
        COMMANDS.labels(subject, "refused").inc()
        if _UNSIGNED_LOGGED.due(durable):
            log.warning(
                "refused a command no service signed (not applied; only the first a minute is logged)",
                extra={"consumer": durable, "subject": subject},
            )
        with contextlib.suppress(Exception):
            await msg.reject()

    async def _working(self, msg: NatsMessage) -> None:
        """While a command's handler runs: tell JetStream every third of `ack_wait` that it is
        being worked on, so that it is not delivered again meanwhile (to another replica)."""
        while True:
            await asyncio.sleep(self.ack_wait / 3)
            with contextlib.suppress(Exception):  # gone: delivered again after ack_wait, idempotent
                await msg.raw_message.in_progress()

    async def _failed(self, msg: NatsMessage, subject: str, durable: str, exc: Exception) -> None:
        """The one retry policy: store faults and retryable errors wait and retry without limit;
        a refusal is dead-lettered at once; a bug is retried, then dead-lettered."""
        retryable = is_backing_store_fault(exc) or (isinstance(exc, ToolbusError) and exc.retryable)
        if retryable:
            if is_redis_fault(exc):
                REDIS.fault(exc)
            else:
                log.warning(
                    "command not applied: will retry",
                    extra={"consumer": durable, "error": type(exc).__name__},
                )
            COMMANDS.labels(subject, "retried").inc()
            with contextlib.suppress(Exception):
                await msg.nack(delay=self.retry_delay)
            return
        if isinstance(exc, ToolbusError):
            await self._dead_letter(msg, subject, durable, f"refused: {exc.code.value}: {exc.message}")
            return
        deliveries = delivered(msg)
        if deliveries >= MAX_DELIVERIES:
            log.exception("command failed %d times: dead-lettered", deliveries, extra={"consumer": durable})
            await self._dead_letter(msg, subject, durable, f"failed {deliveries} times: {type(exc).__name__}")
            return
        log.exception("command failed; will retry", extra={"consumer": durable})
        COMMANDS.labels(subject, "retried").inc()
        with contextlib.suppress(Exception):
            await msg.nack(delay=self.retry_delay * 2 ** (deliveries - 1))

    def dead_letter_subject(self, subject: str) -> str:
        """Where a command on `subject` is kept when dead-lettered."""
        internal = self.subjects.internal_all.removesuffix(">")
        return self.subjects.internal_dead_letters.removesuffix(">") + subject.removeprefix(internal)

    async def _dead_letter(self, msg: NatsMessage, subject: str, durable: str, reason: str) -> None:
        """Keep the message on the dead-letter subject (same stream), then terminate it."""
        sequence = ""
        with contextlib.suppress(Exception):
            sequence = str(msg.raw_message.metadata.sequence.stream)
        headers = {
            "Toolbus-Dead-Subject": subject,
            "Toolbus-Dead-Consumer": durable,
            "Toolbus-Dead-Reason": reason[:500],
            "Toolbus-Dead-Sequence": sequence,
        }
        if sequence:
            headers["Nats-Msg-Id"] = f"dead-{durable}-{sequence}"
        try:
            await self.broker.publish(
                msg.body, self.dead_letter_subject(subject), headers=headers, stream=self.stream, timeout=5.0
            )
        except Exception as exc:  # not kept yet: leave it to be delivered again rather than lose it
            log.warning(
                "dead-lettering failed; will retry", extra={"consumer": durable, "error": type(exc).__name__}
            )
            with contextlib.suppress(Exception):
                await msg.nack(delay=self.retry_delay)
            return
        log.error("command dead-lettered", extra={"consumer": durable, "reason": reason})
        COMMANDS.labels(subject, "deadLettered").inc()
        with contextlib.suppress(Exception):
            await msg.reject()
