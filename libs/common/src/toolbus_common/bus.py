"""The one serving layer of every service: a FastStream `NatsBroker` per service, route tables
that handlers declare themselves on, and the one policy for durable internal commands.

    routes = Routes()

    @routes.request(lambda s: s.approvals_list)
    async def handle_list(approvals: Approvals, request: ApprovalsListRequest) -> ApprovalsListReply:
        return ApprovalsListReply(approvals=await approvals.pending(...))

    bus = Bus(settings, name="approval", queue="toolbus-approval")
    nc = await bus.connect()          # the broker's nats-py connection, for stores and publishers
    bus.include(routes, approvals)    # bind the table to the object its handlers take first
    await bus.start()

What each kind of entry promises:
- `request`: the body is parsed strictly with the handler's annotated model (`invalidRequest`
  naming the field), the handler is called, and exactly one reply goes back with the envelope.
  A backing-store fault is `unavailable`, any other exception `internal`. A reply that cannot be
  sent as built becomes an error reply (`ReplyGuard`): too large for the connection's
  `max_payload` → `outputTooLarge`, not JSON-serializable → `internal`, publish failed →
  `unavailable` (sent once more; a connection that is gone cannot answer at all).
  `fast=True` entries are served by a raw nats-py subscription in the same process (FastStream's
  per-message cost, measured by `bench/transport.py`, is over the hot path's budget; see
  docs/design.md); they behave the same and appear in the AsyncAPI document alike.
- `deferred`: like `request` (always raw), but the handler also gets the reply subject and may
  answer later from anywhere (`calls.invoke`: the replica that finishes the call answers); it
  returns the reply now or `None`. `Bus.reply` is the guarded publish for such later answers.
- `command`: a durable JetStream pull consumer on the INTERNAL stream, shared by every replica
  (each command applied once), handed to FastStream. Acked after the handler returned; a body
  that does not parse, or a non-retryable `ToolbusError`, is dead-lettered
  (`‹p›.internal.deadletter.<rest>`, kept in the same stream, headers say why) and terminated; a
  backing-store fault or a retryable error is retried after `RETRY_DELAY`, without limit; any
  other failure is retried with a growing delay and dead-lettered after `MAX_DELIVERIES`.
- `listen`: a raw subscription with no reply (host heartbeats and results), each message in its
  own task; documented with its model.
- `event`: a subject this service publishes, documented with its model (publishing itself stays
  on the nats-py connection, batched where the hot path needs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar, get_type_hints

import nats.errors
import orjson
from faststream import AckPolicy
from faststream.middlewares import BaseMiddleware
from faststream.nats import JStream, NatsBroker, NatsMessage, PullSub
from faststream.nats.security import NatsCredentials, NatsNKey, NatsSecurity, NatsToken, NatsUserPassword
from faststream.response.publish_type import PublishType
from faststream.specification import AsyncAPI
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy as JsAckPolicy
from nats.js.api import ConsumerConfig, DeliverPolicy
from prometheus_client import Counter, Histogram
from pydantic import BaseModel
from toolbus_contracts import Subjects, ToolbusError, WireModel, consumer_delivery, parse_body, reply_error
from toolbus_contracts.errors import ErrorCode, Internal, OutputTooLarge, Unavailable

from toolbus_common.connections import flush, nats_options
from toolbus_common.direct_sub import spawner, subscribe_direct
from toolbus_common.faults import is_backing_store_fault, is_redis_fault, unavailable
from toolbus_common.logging import Every
from toolbus_common.outages import REDIS
from toolbus_common.settings import Settings
from toolbus_common.signing import SIGNATURE_HEADER, CommandSigner

log = logging.getLogger(__name__)

REQUESTS = Counter(
    "toolbus_requests_total", "Requests served, by subject and result code", ["subject", "code"]
)
LATENCY = Histogram(
    "toolbus_request_seconds",
    "Time from receiving a request to sending its reply",
    ["subject"],
    buckets=(0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5, 10.0),
)
COMMANDS = Counter(
    "toolbus_commands_total",
    "Internal commands handled, by subject and result (applied, retried, deadLettered, refused)",
    ["subject", "result"],
)
REPLY_FAILURES = Counter(
    "toolbus_reply_failures_total", "Replies that could not be sent as built, by cause", ["cause"]
)

_COUNTED: dict[tuple[str, str], Any] = {}
_TIMED: dict[str, Any] = {}


def served(subject: str, code: str, seconds: float) -> None:
    """Count a request and time it: the labelled children are looked up once per subject and code
    (prometheus_client's `labels()` takes a lock and builds the key on every call)."""
    counter = _COUNTED.get((subject, code))
    if counter is None:
        counter = _COUNTED[(subject, code)] = REQUESTS.labels(subject, code)
    timer = _TIMED.get(subject)
    if timer is None:
        timer = _TIMED[subject] = LATENCY.labels(subject)
    counter.inc()
    timer.observe(seconds)


DROPPED_LOG_EVERY = 60.0
"""Seconds between warnings of dropped consumer deliveries on one subject (a flood logs once)."""
_DROPPED_LOGGED = Every(DROPPED_LOG_EVERY)


_MISDIRECTED_LOGGED = Every(DROPPED_LOG_EVERY)
_UNSIGNED_LOGGED = Every(DROPPED_LOG_EVERY)


def misdirected_reply(prefix: str, reply: str | None) -> bool:
    """Whether a request's reply subject is one no service may answer on: a subject of this
    deployment (its events, its INTERNAL stream's commands) or of JetStream (`$JS`, `$KV`, `$O`).
    Replies go to inboxes (`_INBOX...`) and, across NATS accounts, to `_R_...`; a request naming
    another reply subject asks the service to write where its sender may not."""
    if not reply:
        return False
    return reply.startswith("$") or reply.startswith(prefix + ".")


def _refused_reply(subscribed: str, reply: str) -> None:
    if _MISDIRECTED_LOGGED.due(subscribed):
        log.warning(
            "dropped a request whose reply subject is not an inbox: someone asked for the answer "
            "to go where only services write (only the first a minute is logged)",
            extra={"subject": subscribed, "reply": reply[:200]},
        )


def _handed_out(subscribed: str, subject: str, reply: str | None, headers: Any) -> bool:
    """Whether a message on a core subscription is a stored one JetStream handed out
    (`consumer_delivery`), to be dropped unanswered; said at most once a minute per subject."""
    if not consumer_delivery(subscribed, subject, reply, headers):
        return False
    if _DROPPED_LOGGED.due(subscribed):
        log.warning(
            "dropped a message a JetStream consumer delivered here: someone aimed a consumer's "
            "deliveries at this subject (only the first a minute is logged)",
            extra={"subject": subscribed},
        )
    return True


INTERNAL_STREAM = "INTERNAL"
MAX_WORKERS = 256
"""Requests of one subject handled at once by one replica; more wait their turn in memory."""
HEADER_ROOM = 512
"""Bytes of `max_payload` left for the headers FastStream puts on a reply."""
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

D = TypeVar("D")


class RawJson(bytes):
    """A reply's `data` already encoded as JSON (a cached or pydantic-written body)."""


Result = WireModel | dict[str, Any] | RawJson | None


# ---- encoding and the reply guard -------------------------------------------------------------


def encode_ok(result: Result) -> bytes:
    if isinstance(result, RawJson):
        return b'{"ok":true,"data":' + result + b"}"
    if result is None:
        data: Any = {}
    elif isinstance(result, WireModel):
        data = result.wire()
    else:
        data = result
    return orjson.dumps({"ok": True, "data": data})


def encode_error(error: ToolbusError) -> bytes:
    return orjson.dumps(reply_error(error))


def too_large(size: int, max_payload: int) -> bytes:
    REPLY_FAILURES.labels("tooLarge").inc()
    return encode_error(
        OutputTooLarge(
            f"The reply ({size} bytes) does not fit in one NATS message (max_payload {max_payload}); "
            "narrow the request.",
            details={"size": size, "maxPayload": max_payload},
        )
    )


def publish_failed(exc: BaseException) -> bytes:
    """The reply sent when publishing the built reply failed (the connection is the store here)."""
    REPLY_FAILURES.labels("publishFailed").inc()
    if isinstance(exc, nats.errors.MaxPayloadError):
        return encode_error(OutputTooLarge("The reply does not fit in one NATS message; narrow the request."))
    return encode_error(
        Unavailable(
            "The reply could not be sent (the NATS connection is busy or reconnecting); "
            "send the request again.",
            details={"store": "NATS"},
        )
    )


def failure(exc: Exception, subject: str) -> ToolbusError:
    """The error reply for an exception a handler raised."""
    if isinstance(exc, ToolbusError):
        return exc
    if is_backing_store_fault(exc):
        if is_redis_fault(exc):  # one warning per outage, and the count when it ends
            REDIS.fault(exc)
            REDIS.answered_unavailable()
        else:
            log.warning("request failed: backing store unavailable", extra={"subject": subject})
        return unavailable(exc)
    log.exception("request failed", extra={"subject": subject})
    return Internal("toolbus failed to handle this request; it was logged, try again.")


def encode_reply(result: Result, subject: str, limit: int, max_payload: int) -> tuple[bytes, str]:
    """The reply body for `result` and its result code, guarded: never larger than `limit`."""
    try:
        body = encode_ok(result)
    except Exception:
        REPLY_FAILURES.labels("notSerializable").inc()
        log.exception("reply is not serializable", extra={"subject": subject})
        return encode_error(Internal("toolbus built a reply it cannot encode; it was logged.")), "internal"
    if len(body) > limit:
        log.warning("reply too large", extra={"subject": subject, "size": len(body)})
        return too_large(len(body), max_payload), ErrorCode.OUTPUT_TOO_LARGE.value
    return body, "ok"


class ReplyGuard(BaseMiddleware):
    """FastStream middleware: when publishing a reply fails, publish the error reply instead."""

    async def publish_scope(self, call_next: Callable[[Any], Awaitable[Any]], cmd: Any) -> Any:
        try:
            return await call_next(cmd)
        except Exception as exc:
            if getattr(cmd, "publish_type", None) is not PublishType.REPLY:
                raise
            log.warning("reply publish failed", extra={"error": type(exc).__name__})
            cmd.body = publish_failed(exc)
            try:
                return await call_next(cmd)
            except Exception as again:
                log.error("error reply publish failed too", extra={"error": type(again).__name__})
                return None


# ---- route tables -----------------------------------------------------------------------------

SubjectOf = Callable[[Subjects], str]


@dataclass(frozen=True, slots=True)
class Entry:
    kind: str  # request, deferred, command, listen, event
    subject: SubjectOf
    handler: Callable[..., Awaitable[Any]] | None
    model: type[BaseModel]
    reply: type[BaseModel] | None = None
    fast: bool = False
    durable: str = ""
    queue: str | None = None
    service: str = ""
    description: str = ""


def _models(fn: Callable[..., Any], arg: int) -> tuple[type[BaseModel], type[BaseModel] | None]:
    hints = get_type_hints(fn)
    params = list(inspect.signature(fn).parameters)
    model = hints[params[arg]]
    reply = hints.get("return")
    reply_model = reply if isinstance(reply, type) and issubclass(reply, BaseModel) else None
    return model, reply_model


def _doc(fn: Callable[..., Any]) -> str:
    return inspect.cleandoc(fn.__doc__ or "")


REQUEST_HEADERS: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("request_headers")
"""The NATS headers of the request a handler is serving (empty when it had none): for the few
handlers that read one (the approval service's `Nats-Request-Info`)."""


@dataclass
class Routes(Generic[D]):
    """What one part of a service serves and publishes; handlers take the bound object first.
    `service` names the consumer side of commands in the AsyncAPI document (two services may
    consume one subject, each with its durable consumer)."""

    service: str
    entries: list[Entry] = field(default_factory=list)

    def request(
        self, subject: SubjectOf, *, fast: bool = False, reply: type[BaseModel] | None = None
    ) -> Callable[[Callable[[D, Any], Awaitable[Result]]], Callable[[D, Any], Awaitable[Result]]]:
        def add(fn: Callable[[D, Any], Awaitable[Result]]) -> Callable[[D, Any], Awaitable[Result]]:
            model, returned = _models(fn, 1)
            self.entries.append(
                Entry(
                    "request",
                    subject,
                    fn,
                    model,
                    reply or returned,
                    fast,
                    service=self.service,
                    description=_doc(fn),
                )
            )
            return fn

        return add

    def deferred(
        self, subject: SubjectOf, *, reply: type[BaseModel]
    ) -> Callable[[Callable[[D, Any, str], Awaitable[Result]]], Callable[[D, Any, str], Awaitable[Result]]]:
        def add(fn: Callable[[D, Any, str], Awaitable[Result]]) -> Callable[[D, Any, str], Awaitable[Result]]:
            model, _ = _models(fn, 1)
            self.entries.append(
                Entry("deferred", subject, fn, model, reply, True, service=self.service, description=_doc(fn))
            )
            return fn

        return add

    def command(
        self, subject: SubjectOf, *, durable: str
    ) -> Callable[[Callable[[D, Any], Awaitable[None]]], Callable[[D, Any], Awaitable[None]]]:
        def add(fn: Callable[[D, Any], Awaitable[None]]) -> Callable[[D, Any], Awaitable[None]]:
            model, _ = _models(fn, 1)
            self.entries.append(
                Entry(
                    "command", subject, fn, model, durable=durable, service=self.service, description=_doc(fn)
                )
            )
            return fn

        return add

    def listen(
        self, subject: SubjectOf, model: type[BaseModel], *, queue: str | None = None
    ) -> Callable[[Callable[[D, Msg], Awaitable[None]]], Callable[[D, Msg], Awaitable[None]]]:
        def add(fn: Callable[[D, Msg], Awaitable[None]]) -> Callable[[D, Msg], Awaitable[None]]:
            self.entries.append(Entry("listen", subject, fn, model, queue=queue, description=_doc(fn)))
            return fn

        return add

    def event(self, subject: SubjectOf, model: type[BaseModel], description: str) -> None:
        self.entries.append(Entry("event", subject, None, model, description=inspect.cleandoc(description)))


# ---- the bus ----------------------------------------------------------------------------------


async def _passthrough(msg: Any) -> Any:
    """Decoder: hand the handler the FastStream message itself (the bus parses the body)."""
    return msg


def _delivered(msg: NatsMessage) -> int:
    with contextlib.suppress(Exception):  # the in-memory test broker's messages carry no metadata
        return int(msg.raw_message.metadata.num_delivered)
    return 1


def _schema_signature(model: type[BaseModel], reply: type[BaseModel] | None) -> inspect.Signature:
    param = inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=model)
    return inspect.Signature([param], return_annotation=reply)


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
        title: str = "",
        retry_delay: float = RETRY_DELAY,
        ack_wait: float = ACK_WAIT,
    ) -> None:
        self.settings = settings
        self.retry_delay = retry_delay
        self.ack_wait = ack_wait
        self.subjects = settings.subjects
        self.name = name
        self.queue = queue
        self.title = title or f"toolbus {name}"
        self.stream = settings.js_name(INTERNAL_STREAM)
        self.broker = NatsBroker(
            **broker_options(settings, f"toolbus-{name}"),
            apply_types=False,
            logger=None,
            middlewares=[ReplyGuard],
            graceful_timeout=10.0,
        )
        self._tables: list[Routes[Any]] = []
        self._raw: list[tuple[str, str, Callable[[Msg], Coroutine[Any, Any, None]]]] = []
        self._subs: list[Subscription] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._nc: NatsClient | None = None
        self.max_payload = 1024 * 1024
        self._started = False
        self._signer: CommandSigner | None = None
        self._has_commands = False

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
        self._tables.append(routes)
        for entry in routes.entries:
            if entry.kind == "command" and durable_prefix:
                entry = replace(entry, durable=durable_prefix + entry.durable)
            self._register(self.broker, entry, bound, raw_fast=serve_fast_raw)

    def _register(self, broker: NatsBroker, entry: Entry, bound: Any, *, raw_fast: bool) -> None:
        subject = entry.subject(self.subjects)
        title = subject.removeprefix(self.subjects.prefix + ".")
        if entry.kind == "event":
            broker.publisher(subject, title=title, description=entry.description, schema=entry.model)
            return
        if entry.kind == "command":
            self._command(broker, entry, bound, subject, f"{title}:{entry.service}")
            return
        if entry.kind == "listen":
            if raw_fast:
                self._raw.append((subject, entry.queue or "", self._listener(entry, bound)))
            else:
                broker.subscriber(
                    subject,
                    queue=entry.queue or "",
                    decoder=_passthrough,
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
            decoder=_passthrough,
            max_workers=MAX_WORKERS,
            no_reply=entry.kind == "deferred",
            title=title,
            description=entry.description,
        )(serve)

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
            if _handed_out(
                subject, getattr(raw, "subject", subject), msg.reply_to, getattr(raw, "headers", None)
            ):
                # FastStream answers a None result with an empty message to the reply subject,
                # here a `$JS.ACK.` one (refused under the secured configuration, a warning each):
                # with no reply subject it sends nothing.
                msg.reply_to = ""
                return None
            if misdirected_reply(self.subjects.prefix, msg.reply_to):
                _refused_reply(subject, msg.reply_to)
                msg.reply_to = ""
                return None
            REQUEST_HEADERS.set(getattr(raw, "headers", None) or {})
            body = await self._answer(entry, bound, subject, msg.body, msg.reply_to)
            if body is not None and entry.kind == "deferred" and msg.reply_to:
                await self.reply(msg.reply_to, body)
                return None
            return body

        serve.__signature__ = _schema_signature(entry.model, entry.reply)  # type: ignore[attr-defined]
        serve.__name__ = getattr(entry.handler, "__name__", "serve")
        return serve

    def _raw_request(
        self, entry: Entry, bound: Any, subject: str
    ) -> Callable[[Msg], Coroutine[Any, Any, None]]:
        async def serve(msg: Msg) -> None:
            if _handed_out(subject, msg.subject, msg.reply, msg.headers):
                return
            if misdirected_reply(self.subjects.prefix, msg.reply):
                _refused_reply(subject, msg.reply)
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
            if _handed_out(subscribed, msg.subject, msg.reply, msg.headers):
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

        serve.__signature__ = _schema_signature(entry.model, None)  # type: ignore[attr-defined]
        return serve

    def _spawning(self, fn: Callable[[Msg], Awaitable[None]]) -> Callable[[Msg], Awaitable[None]]:
        """Each message in its own task, so a slow one never holds up the next (nats-py calls a
        subscription's callback one message at a time)."""

        async def cb(msg: Msg) -> None:
            task: asyncio.Task[None] = asyncio.ensure_future(fn(msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return cb

    # -- commands --

    def _command(self, broker: NatsBroker, entry: Entry, bound: Any, subject: str, title: str) -> None:
        self._has_commands = True
        if self._signer is None and self.settings.secret_key is not None:
            self._signer = CommandSigner(self.settings.secret_key)
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
            decoder=_passthrough,
            title=title,
            description=entry.description,
        )(self._consumer(entry, bound, subject))

    def _consumer(self, entry: Entry, bound: Any, subject: str) -> Callable[[NatsMessage], Awaitable[None]]:
        assert entry.handler is not None
        apply = entry.handler
        durable = entry.durable

        async def consume(msg: NatsMessage) -> None:
            headers = getattr(msg.raw_message, "headers", None) or {}
            signer = self._signer
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

        consume.__signature__ = _schema_signature(entry.model, None)  # type: ignore[attr-defined]
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
        deliveries = _delivered(msg)
        if deliveries >= MAX_DELIVERIES:
            log.exception("command failed %d times: dead-lettered", deliveries, extra={"consumer": durable})
            await self._dead_letter(msg, subject, durable, f"failed {deliveries} times: {type(exc).__name__}")
            return
        log.exception("command failed; will retry", extra={"consumer": durable})
        COMMANDS.labels(subject, "retried").inc()
        with contextlib.suppress(Exception):
            await msg.nack(delay=self.retry_delay * 2 ** (deliveries - 1))

    def dead_letter_subject(self, subject: str) -> str:
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

    # -- lifecycle --

    async def start(self) -> None:
        """Start FastStream's subscribers and the raw ones; returns once the server has them all.
        A bus with command consumers needs `TOOLBUS_SECRET_KEY` (`ValueError` naming it)."""
        if self._has_commands and self._signer is None:
            self._signer = CommandSigner.of(self.settings)
        if self._nc is None:
            await self.connect()
        await self.broker.start()
        for subject, queue, handle in self._raw:
            # each message straight from the client's reader into a task of its own
            deliver = spawner(self._tasks, handle)
            self._subs.append(await subscribe_direct(self.nc, subject, deliver, queue=queue))
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
        self.broker._connection = None  # closed above; FastStream would drain it again (30 s on pulls)
        with contextlib.suppress(Exception):
            await self.broker.stop()

    # -- the document --

    def asyncapi(self) -> dict[str, Any]:
        """This service's AsyncAPI 3 document (see `asyncapi_document`)."""
        return asyncapi_document(self.settings, self._tables, title=self.title)


def asyncapi_document(
    settings: Settings, tables: Sequence[Routes[Any]], *, title: str, description: str = ""
) -> dict[str, Any]:
    """The AsyncAPI 3 document FastStream generates for these route tables (registered on a broker
    that is never connected, so no handler runs), with each request's reply envelope added:
    FastStream 0.7 writes the request side of a subscriber only, so the reply messages and `reply`
    objects are built here from the same contract models."""
    spec = Bus(settings, name="spec", queue="spec", title=title)
    entries = [entry for table in tables for entry in table.entries]
    for entry in entries:
        spec._register(spec.broker, entry, None, raw_fast=False)
    doc: dict[str, Any] = orjson.loads(
        AsyncAPI(spec.broker, title=title, version="1.1", description=description, schema_version="3.0.0")
        .to_specification()
        .to_json()
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    messages = doc["components"].setdefault("messages", {})
    schemas["ErrorObject"] = _error_schema()
    for entry in entries:
        if entry.kind not in ("request", "deferred"):
            continue
        key = entry.subject(settings.subjects).removeprefix(settings.subjects.prefix + ".")
        data_ref: dict[str, Any] = {"type": "object"}
        if entry.reply is not None:
            reply_schema = entry.reply.model_json_schema(
                by_alias=True, ref_template="#/components/schemas/{model}"
            )
            schemas.update(reply_schema.pop("$defs", {}))
            schemas[entry.reply.__name__] = reply_schema
            data_ref = {"$ref": f"#/components/schemas/{entry.reply.__name__}"}
        name = f"{key}:Reply"
        messages[name] = {
            "title": name,
            "payload": {
                "oneOf": [
                    {
                        "type": "object",
                        "properties": {"ok": {"const": True}, "data": data_ref},
                        "required": ["ok", "data"],
                        "additionalProperties": False,
                    },
                    {
                        "type": "object",
                        "properties": {
                            "ok": {"const": False},
                            "error": {"$ref": "#/components/schemas/ErrorObject"},
                        },
                        "required": ["ok", "error"],
                        "additionalProperties": False,
                    },
                ]
            },
        }
        channel = doc["channels"][key]
        channel["messages"]["Reply"] = {"$ref": f"#/components/messages/{name}"}
        doc["operations"][key]["reply"] = {
            "address": {
                "location": "$message.header#/reply",
                "description": "the request's NATS reply subject",
            },
            "channel": {"$ref": f"#/channels/{key}"},
            "messages": [{"$ref": f"#/channels/{key}/messages/Reply"}],
        }
    ordered: dict[str, Any] = _sorted(doc)
    return ordered


def _error_schema() -> dict[str, Any]:
    return {
        "title": "ErrorObject",
        "type": "object",
        "properties": {
            "code": {"type": "string", "enum": [c.value for c in ErrorCode]},
            "message": {"type": "string"},
            "details": {"type": "object"},
        },
        "required": ["code", "message"],
    }


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def iter_subjects(doc: dict[str, Any]) -> Iterator[str]:
    """Every channel address of a document, sorted."""
    yield from sorted(ch["address"] for ch in doc.get("channels", {}).values())
