"""Request/reply over bare nats-py: parse the body with its contract model, call one function,
reply once with the envelope. Every request with a reply subject gets exactly one reply.

Why not FastStream: see docs/design.md (it costs ~320 µs a message here; the dispatcher's whole
budget is 500 µs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from prometheus_client import Counter, Histogram
from pydantic import BaseModel
from toolbus_contracts import ToolbusError, WireModel, parse_body, reply_error
from toolbus_contracts.errors import Internal

from toolbus_common.faults import is_backing_store_fault, unavailable

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


class RawJson(bytes):
    """A reply's `data` already encoded as JSON (a cached or pydantic-written body)."""


Req = TypeVar("Req", bound=BaseModel)
Result = WireModel | dict[str, Any] | RawJson | None
Handler = Callable[[Req], Awaitable[Result]]
RawHandler = Callable[[Msg], Awaitable[None]]


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


@dataclass(frozen=True, slots=True)
class _Route:
    subject: str
    model: type[BaseModel]
    handler: Callable[[Any], Awaitable[Result]]


class RpcServer:
    """Serves a set of request subjects in one queue group on one NATS connection.

    Each message is handled in its own task, so a slow request never holds up the next one.
    `drain()` stops taking new requests and waits for those in progress.
    """

    def __init__(self, nc: NatsClient, *, queue: str) -> None:
        self._nc = nc
        self._queue = queue
        self._routes: list[_Route] = []
        self._raw: list[tuple[str, RawHandler, str | None]] = []
        self._subs: list[Subscription] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def route(self, subject: str, model: type[Req], handler: Handler[Req]) -> None:
        self._routes.append(_Route(subject, model, handler))

    def raw(self, subject: str, handler: RawHandler, *, queue: str | None = None) -> None:
        """A subscription that takes the raw message (events, heartbeats); no envelope reply."""
        self._raw.append((subject, handler, queue))

    async def start(self) -> None:
        for route in self._routes:
            self._subs.append(
                await self._nc.subscribe(route.subject, queue=self._queue, cb=self._callback(route))
            )
        for subject, handler, queue in self._raw:
            self._subs.append(
                await self._nc.subscribe(subject, queue=queue or "", cb=self._spawn_raw(handler))
            )
        # nats-py buffers SUB lines; a PING/PONG round trip proves the server has them, so a request
        # sent once `start()` returns (the service reports ready) always finds its subscriber.
        await self._nc.flush()

    def _callback(self, route: _Route) -> Callable[[Msg], Awaitable[None]]:
        async def cb(msg: Msg) -> None:
            task = asyncio.create_task(self._serve(route, msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return cb

    def _spawn_raw(self, handler: RawHandler) -> Callable[[Msg], Awaitable[None]]:
        async def cb(msg: Msg) -> None:
            task = asyncio.create_task(self._run_raw(handler, msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return cb

    async def _run_raw(self, handler: RawHandler, msg: Msg) -> None:
        try:
            await handler(msg)
        except Exception:
            log.exception("handler failed", extra={"subject": msg.subject})

    async def _serve(self, route: _Route, msg: Msg) -> None:
        started = time.perf_counter()
        code = "ok"
        try:
            request = parse_body(route.model, msg.data)
            body = encode_ok(await route.handler(request))
        except ToolbusError as exc:
            code = exc.code.value
            body = encode_error(exc)
        except Exception as exc:
            if is_backing_store_fault(exc):
                error: ToolbusError = unavailable(exc)
                log.warning("request failed: backing store unavailable", extra={"subject": route.subject})
            else:
                error = Internal("toolbus failed to handle this request; it was logged, try again.")
                log.exception("request failed", extra={"subject": route.subject})
            code = error.code.value
            body = encode_error(error)
        if msg.reply:
            try:
                await self._nc.publish(msg.reply, body)
            except Exception:
                log.exception("reply failed", extra={"subject": route.subject})
        REQUESTS.labels(route.subject, code).inc()
        LATENCY.labels(route.subject).observe(time.perf_counter() - started)

    async def drain(self, grace: float = 10.0) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):  # the connection may already be gone
                await sub.unsubscribe()
        self._subs.clear()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace)
