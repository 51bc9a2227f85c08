"""`Bus`: one service's FastStream `NatsBroker`, the raw nats-py subscriptions of its hot-path
routes, its listeners and its command consumers, wired from route tables (see the package)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any

from faststream.nats import NatsBroker, NatsMessage
from faststream.nats.security import NatsCredentials, NatsNKey, NatsSecurity, NatsToken, NatsUserPassword
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from toolbus_contracts import parse_body

from toolbus_common.connections import flush, nats_options
from toolbus_common.framework.commands import (
    ACK_WAIT,
    RETRY_DELAY,
    Commands,
    passthrough,
    schema_signature,
)
from toolbus_common.framework.metrics import served
from toolbus_common.framework.replies import (
    HEADER_ROOM,
    ReplyGuard,
    encode_error,
    encode_reply,
    failure,
    handed_out,
    misdirected_reply,
    publish_failed,
    refused_reply,
    too_large,
)
from toolbus_common.framework.routes import REQUEST_HEADERS, D, Entry, Routes
from toolbus_common.private.faststream_broker import forget_connection
from toolbus_common.settings import Settings

log = logging.getLogger("toolbus_common.bus")

MAX_WORKERS = 256
"""Requests of one subject handled at once by one replica; more wait their turn in memory."""


def broker_options(settings: Settings, name: str) -> dict[str, Any]:
    """`nats_options` as `NatsBroker` takes them: its credentials and TLS go in one FastStream
    security object (the broker hands them to `nats.connect` unchanged)."""
    options = nats_options(settings, name)
    tls = options.pop("tls", None)
    common: dict[str, Any] = {"ssl_context": tls, "tls_hostname": options.pop("tls_hostname", None)}
    security: NatsSecurity | None = None
    if "user_credentials" in options:
        security = NatsCredentials(options.pop("user_credentials"), **common)
    elif "nkeys_seed" in options:
        security = NatsNKey(options.pop("nkeys_seed"), **common)
    elif "user" in options:
        security = NatsUserPassword(options.pop("user"), options.pop("password", ""), **common)
    elif "token" in options:
        security = NatsToken(options.pop("token"), **common)
    elif tls is not None:
        security = NatsSecurity(**common)
    if security is not None:
        options["security"] = security
    return options


class Bus:
    """One service's FastStream broker, its raw hot-path subscriptions and its command consumers."""

    def __init__(
        self,
        settings: Settings,
        *,
        name: str,
        queue: str,
        retry_delay: float = RETRY_DELAY,
        ack_wait: float = ACK_WAIT,
    ) -> None:
        self.settings = settings
        self.subjects = settings.subjects
        self.name = name
        self.queue = queue
        self.broker = NatsBroker(
            **broker_options(settings, f"toolbus-{name}"),
            apply_types=False,
            logger=None,
            middlewares=[ReplyGuard],
            graceful_timeout=10.0,
        )
        self.commands = Commands(settings, self.broker, retry_delay=retry_delay, ack_wait=ack_wait)
        self.stream = self.commands.stream
        self._raw: list[tuple[str, str, Callable[[Msg], Coroutine[Any, Any, None]]]] = []
        self._subs: list[Subscription] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._nc: NatsClient | None = None
        self.max_payload = 1024 * 1024
        self._started = False

    # -- wiring --

    async def connect(self) -> NatsClient:
        """Connect the broker; its nats-py connection is the service's one connection."""
        self._nc = await self.broker.connect()
        self.max_payload = self._nc.max_payload or self.max_payload
        return self._nc

    @property
    def nc(self) -> NatsClient:
        assert self._nc is not None, "Bus.connect() first"
        return self._nc

    def include(
        self, routes: Routes[D], bound: D, *, durable_prefix: str = "", serve_fast_raw: bool = True
    ) -> None:
        """Serve `routes`, their handlers bound to `bound`; command consumers' durable names get
        `durable_prefix`. `serve_fast_raw=False` serves the `fast` and `listen` entries through
        FastStream too (tests with the in-memory broker)."""
        for entry in routes.entries:
            if entry.kind == "command" and durable_prefix:
                entry = replace(entry, durable=durable_prefix + entry.durable)
            self.register(entry, bound, raw_fast=serve_fast_raw)

    def register(self, entry: Entry, bound: Any, *, raw_fast: bool) -> None:
        """Subscribe (or, for an event, declare) one route entry on this bus's broker."""
        broker = self.broker
        subject = entry.subject(self.subjects)
        title = subject.removeprefix(self.subjects.prefix + ".")
        if entry.kind == "event":
            broker.publisher(subject, title=title, description=entry.description, schema=entry.model)
            return
        if entry.kind == "command":
            self.commands.subscribe(broker, entry, bound, subject, f"{title}:{entry.service}")
            return
        if entry.kind == "listen":
            if raw_fast:
                self._raw.append((subject, entry.queue or "", self._listener(entry, bound)))
            else:
                broker.subscriber(
                    subject,
                    queue=entry.queue or "",
                    decoder=passthrough,
                    no_reply=True,
                    title=title,
                    description=entry.description,
                )(self._fs_listener(entry, bound))
            return
        queue = f"toolbus-{entry.service}" if entry.service else self.queue
        if raw_fast and entry.fast:
            self._raw.append((subject, queue, self._raw_request(entry, bound, subject)))
            return
        serve = self._fs_request(entry, bound, subject)
        broker.subscriber(
            subject,
            queue=queue,
            decoder=passthrough,
            max_workers=MAX_WORKERS,
            no_reply=entry.kind == "deferred",
            title=title,
            description=entry.description,
        )(serve)

    def dead_letter_subject(self, subject: str) -> str:
        """Where a command on `subject` is kept when dead-lettered."""
        return self.commands.dead_letter_subject(subject)

    # -- requests --
    async def _answer(
        self, entry: Entry, bound: Any, subject: str, data: bytes, reply_to: str
    ) -> bytes | None:
        started = time.perf_counter()
        assert entry.handler is not None
        try:
            request = parse_body(entry.model, data)
            if entry.kind == "deferred":
                result = await entry.handler(bound, request, reply_to)
                if result is None:
                    return None
            else:
                result = await entry.handler(bound, request)
            body, code = encode_reply(result, subject, self.max_payload - HEADER_ROOM, self.max_payload)
        except Exception as exc:
            error = failure(exc, subject)
            code = error.code.value
            body = encode_error(error)
        served(subject, code, time.perf_counter() - started)
        return body

    def _fs_request(
        self, entry: Entry, bound: Any, subject: str
    ) -> Callable[[NatsMessage], Awaitable[bytes | None]]:
        async def serve(msg: NatsMessage) -> bytes | None:
            raw = msg.raw_message
            if handed_out(
                subject, getattr(raw, "subject", subject), msg.reply_to, getattr(raw, "headers", None)
            ):
                # FastStream answers a None result with an empty message to the reply subject,
                # here a `$JS.ACK.` one (refused under the secured configuration, a warning each):
                # with no reply subject it sends nothing.
                msg.reply_to = ""
                return None
            if misdirected_reply(self.subjects.prefix, msg.reply_to):
                refused_reply(subject, msg.reply_to)
                msg.reply_to = ""
                return None
            REQUEST_HEADERS.set(getattr(raw, "headers", None) or {})
            body = await self._answer(entry, bound, subject, msg.body, msg.reply_to)
            if body is not None and entry.kind == "deferred" and msg.reply_to:
                await self.reply(msg.reply_to, body)
                return None
            return body

        serve.__signature__ = schema_signature(entry.model, entry.reply)  # type: ignore[attr-defined]
        serve.__name__ = getattr(entry.handler, "__name__", "serve")
        return serve

    def _raw_request(
        self, entry: Entry, bound: Any, subject: str
    ) -> Callable[[Msg], Coroutine[Any, Any, None]]:
        async def serve(msg: Msg) -> None:
            if handed_out(subject, msg.subject, msg.reply, msg.headers):
                return
            if misdirected_reply(self.subjects.prefix, msg.reply):
                refused_reply(subject, msg.reply)
                return
            REQUEST_HEADERS.set(msg.headers or {})
            body = await self._answer(entry, bound, subject, msg.data, msg.reply)
            if body is not None and msg.reply:
                await self.reply(msg.reply, body)

        return serve

    async def reply(self, subject: str, body: bytes) -> None:
        """Publish a reply on the service's connection, guarded like every other reply: too large
        → `outputTooLarge`, publish failed → `unavailable` (once more), never silence."""
        if len(body) > self.max_payload:
            body = too_large(len(body), self.max_payload)
        try:
            await self.nc.publish(subject, body)
        except Exception as exc:
            log.warning("reply publish failed", extra={"error": type(exc).__name__})
            try:
                await self.nc.publish(subject, publish_failed(exc))
            except Exception as again:
                log.error("error reply publish failed too", extra={"error": type(again).__name__})

    # -- listeners --

    def _listener(self, entry: Entry, bound: Any) -> Callable[[Msg], Coroutine[Any, Any, None]]:
        assert entry.handler is not None
        handler = entry.handler
        subscribed = entry.subject(self.subjects)

        async def listen(msg: Msg) -> None:
            if handed_out(subscribed, msg.subject, msg.reply, msg.headers):
                return
            try:
                await handler(bound, msg)
            except Exception:
                log.exception("handler failed", extra={"subject": msg.subject})

        return listen

    def _fs_listener(self, entry: Entry, bound: Any) -> Callable[[NatsMessage], Awaitable[None]]:
        listen = self._spawning(self._listener(entry, bound))

        async def serve(msg: NatsMessage) -> None:
            await listen(msg.raw_message)

        serve.__signature__ = schema_signature(entry.model, None)  # type: ignore[attr-defined]
        return serve

    def _spawning(self, fn: Callable[[Msg], Awaitable[None]]) -> Callable[[Msg], Awaitable[None]]:
        """Each message in its own task, so a slow one never holds up the next (nats-py calls a
        subscription's callback one message at a time)."""

        async def cb(msg: Msg) -> None:
            task: asyncio.Task[None] = asyncio.ensure_future(fn(msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return cb

    # -- lifecycle --

    async def start(self) -> None:
        """Start FastStream's subscribers and the raw ones; returns once the server has them all.
        A bus with command consumers needs `TOOLBUS_SECRET_KEY` (`ValueError` naming it)."""
        self.commands.require_signer()
        if self._nc is None:
            await self.connect()
        await self.broker.start()
        for subject, queue, handle in self._raw:
            # each message straight from the client's reader into a task of its own
            self._subs.append(await self.nc.subscribe(subject, queue=queue, cb=self._spawning(handle)))
        # nats-py buffers SUB lines; a PING/PONG round trip proves the server has them, so a request
        # sent once `start()` returns (the service reports ready) always finds its subscriber.
        await flush(self.nc)
        self._started = True

    def ready(self) -> bool:
        return self._started and self._nc is not None and self._nc.is_connected

    async def drain(self, grace: float = 10.0) -> None:
        """Stop taking requests and commands; wait up to `grace` for those in progress."""
        self._started = False
        for sub in self._subs:
            with contextlib.suppress(Exception):  # the connection may already be gone
                await sub.unsubscribe()
        self._subs.clear()
        for subscriber in list(self.broker.subscribers):
            with contextlib.suppress(Exception):
                await subscriber.stop()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace)

    async def close(self) -> None:
        """Send what is buffered (replies, events), then close the connection."""
        nc, self._nc = self._nc, None
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.flush(timeout=5)
            with contextlib.suppress(Exception):
                await nc.close()
        forget_connection(self.broker)  # closed above; FastStream would drain it again (30 s on pulls)
        with contextlib.suppress(Exception):
            await self.broker.stop()
