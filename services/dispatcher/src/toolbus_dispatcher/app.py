"""Builds the dispatcher from settings: connections, streams, executors, subjects and internal
command consumers (`toolbus_common.bus`), background loops (lease renewal, reaper).
`DispatcherApp` is what `run_service` runs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client as NatsClient
from redis.asyncio import Redis
from toolbus_common.bus import Bus, asyncapi_document
from toolbus_common.connections import (
    JsPlacement,
    connect_redis,
    connect_script_pipe,
    ensure_stream,
    events_stream_limits,
    flush,
    internal_stream_limits,
)
from toolbus_common.in_flight import InFlight
from toolbus_common.keys import Keys
from toolbus_common.outages import expected_fault
from toolbus_common.private.httpcore_guard import Resolver
from toolbus_common.script_pipe import ScriptPipe
from toolbus_common.signing import CommandSigner
from toolbus_common.tasks import cancel_and_wait
from toolbus_common.toolsets import ToolsetStore
from toolbus_contracts.registry import ToolKind

from toolbus_dispatcher.calls import CallRunner
from toolbus_dispatcher.credentials import CredentialResolver, NoCredentials, StoreCredentials
from toolbus_dispatcher.events import EventRelay
from toolbus_dispatcher.executors.base import Executor
from toolbus_dispatcher.executors.host import HostExecutor
from toolbus_dispatcher.executors.http import HttpExecutor
from toolbus_dispatcher.executors.mcp import McpExecutor, McpPoolLike
from toolbus_dispatcher.executors.workflow import WorkflowExecutor
from toolbus_dispatcher.handlers import QUEUE, host_routes, routes
from toolbus_dispatcher.output_memory import OutputMemory
from toolbus_dispatcher.outputs import OutputStore, inline_limit
from toolbus_dispatcher.service import DispatcherService
from toolbus_dispatcher.settings import DispatcherSettings
from toolbus_dispatcher.store import CallStore

log = logging.getLogger(__name__)


def default_credentials(settings: DispatcherSettings, redis: Redis[bytes], keys: Keys) -> CredentialResolver:
    """The credentials service's encrypted store when a secret key is set; else no credentials."""
    if settings.secret_key is None:
        log.warning("TOOLBUS_SECRET_KEY is not set: MCP calls are sent without credential headers")
        return NoCredentials()
    from toolbus_common.credential_store import CredentialStore
    from toolbus_common.secrets import Cipher

    return StoreCredentials(CredentialStore(redis, keys, Cipher.from_settings(settings)))


def pipe_reply_timeout(settings: DispatcherSettings) -> float:
    """How long the hot-path pipe waits on a silent Redis connection before its commands fail and
    are retried on a new one: a quarter of the lease, at least 1 s, at most
    `TOOLBUS_REDIS_SOCKET_TIMEOUT`. A store step whose reply was
    lost hands over the calls it admitted when retried (see `store.py`); those calls' leases run
    from their admission and nobody renews them until then, so the retry must come well inside a
    lease, or they lapse and are resumed as interrupted (`outcomeUnknown` for an `at_most_once`
    call that was never sent)."""
    return min(settings.redis_socket_timeout, max(1.0, settings.dispatcher_lease / 4))


class DispatcherApp:
    """The dispatcher service: start, stop, ready."""

    name = "dispatcher"

    def __init__(
        self,
        settings: DispatcherSettings,
        *,
        mcp_pool: McpPoolLike | None = None,
        credentials: CredentialResolver | None = None,
        http_resolver: Resolver | None = None,
    ) -> None:
        """`http_resolver`: how http.fetch resolves names (tests give a stub; default: the system)."""
        self.settings = settings
        self._http_resolver = http_resolver
        self.owner = f"d_{uuid.uuid4().hex[:16]}"
        self._mcp_pool = mcp_pool
        self._credentials = credentials
        self._ready = False
        self._loops: list[asyncio.Task[None]] = []
        self.nc: NatsClient | None = None
        self.redis: Redis[bytes] | None = None
        self.bus = Bus(settings, name="dispatcher", queue=QUEUE)
        self.runner: CallRunner | None = None
        self.service: DispatcherService | None = None
        self.relay: EventRelay | None = None
        self.outputs: OutputStore | None = None
        self.output_memory = OutputMemory(settings.dispatcher_output_memory)
        """The bound on large outputs in flight (`TOOLBUS_DISPATCHER_OUTPUT_MEMORY`)."""
        self._http: HttpExecutor | None = None
        self._pipe: ScriptPipe | None = None
        self._relay_pipe: ScriptPipe | None = None
        self._owns_pool = mcp_pool is None
        self.invokes = InFlight()
        """The `calls.invoke` requests being served (the service counts, the relay waits on them)."""

    def ready(self) -> bool:
        return self._ready and self.bus.ready()

    def asyncapi(self) -> dict[str, Any]:
        return asyncapi_document(self.settings, [routes, host_routes], title="toolbus dispatcher")

    async def start(self) -> None:
        s = self.settings
        subjects = s.subjects
        keys = Keys(s.key_prefix)
        nc = self.nc = await self.bus.connect()
        js = nc.jetstream()
        redis = self.redis = connect_redis(s)
        await ensure_stream(js, s.js_name("EVENTS"), [subjects.all_events], **events_stream_limits(s))
        await ensure_stream(js, s.js_name("INTERNAL"), [subjects.internal_all], **internal_stream_limits(s))
        toolsets = ToolsetStore(js, s.js_name("toolsets"), placement=JsPlacement.of(s))
        await toolsets.open()
        credentials = self._credentials or default_credentials(s, redis, keys)
        if self._mcp_pool is None:
            from toolbus_mcp_client import McpPool

            self._mcp_pool = McpPool(max_body=s.max_output_bytes, egress=s.egress.checker())
        host = HostExecutor(nc, subjects)
        self._http = HttpExecutor(
            max_body=s.http_max_body or s.max_output_bytes,
            max_redirects=s.http_max_redirects,
            egress=s.egress,
            resolver=self._http_resolver,
            max_headers=s.http_max_headers,
            max_header_bytes=s.http_max_header_bytes,
        )
        executors: dict[ToolKind, Executor] = {
            "mcp": McpExecutor(self._mcp_pool, credentials),
            "host": host,
            "http": self._http,
            "workflow": WorkflowExecutor(nc, subjects, default_timeout=s.dispatcher_workflow_timeout),
        }
        self._pipe = connect_script_pipe(s, redis, reply_timeout=pipe_reply_timeout(s))
        store = CallStore(
            redis,
            keys,
            self.owner,
            lease=s.dispatcher_lease,
            pipe=self._pipe,
            events_prefix=subjects.call_events("", "")[:-1],
            runs_closed_subject=subjects.internal_runs_closed,
        )
        await store.load_scripts()
        # The relay's own pipe (its XREAD BLOCK holds a connection), on the pool's reply timeout:
        # above the longest block (REDIS_LONGEST_BLOCK, the relay's at most), as redis-py's was.
        self._relay_pipe = connect_script_pipe(s, redis)
        self.relay = EventRelay(
            redis,
            nc,
            store.outbox,
            self.owner,
            lock=keys.call_events_relay_lock,
            lock_ttl=s.dispatcher_relay_lock_ttl,
            pipe=self._relay_pipe,
            invokes=self.invokes,
            signer=CommandSigner.of(s),
            commands=subjects.internal_all.removesuffix(">"),
        )
        inline, clamped = inline_limit(s.dispatcher_inline_output_bytes, nc.max_payload)
        if clamped:
            log.warning(
                "TOOLBUS_DISPATCHER_INLINE_OUTPUT_BYTES is more than fits in one NATS message; "
                "outputs larger than the limit used go by reference",
                extra={
                    "configured": s.dispatcher_inline_output_bytes,
                    "used": inline,
                    "maxPayload": nc.max_payload,
                },
            )
        outputs = self.outputs = OutputStore(
            js,
            s.js_name("outputs"),
            ttl=s.output_ttl,
            inline_limit=inline,
            placement=JsPlacement.of(s),
        )
        await outputs.open()
        runner = self.runner = CallRunner(
            store=store,
            toolsets=toolsets,
            executors=executors,
            outputs=outputs,
            publish_reply=self.bus.reply,
            subjects=subjects,
            retry_backoff=s.dispatcher_retry_backoff,
            retry_backoff_max=s.dispatcher_retry_backoff_max,
            memory=self.output_memory,
        )
        self.service = DispatcherService(
            store=store,
            toolsets=toolsets,
            runner=runner,
            credentials=credentials,
            subjects=subjects,
            run_retention=s.dispatcher_run_retention,
            message_limit=inline_limit(None, nc.max_payload)[0],  # what fits with its fields
            publish_reply=self.bus.reply,
            invokes=self.invokes,
        )
        self.bus.include(routes, self.service, durable_prefix=f"{s.dispatcher_consumer}-")
        # Every replica hears every heartbeat and result; each routes only to attempts it waits on.
        self.bus.include(host_routes, host)
        await self.bus.start()
        self._loops = [
            asyncio.create_task(self.relay.run()),
            asyncio.create_task(self._every(s.dispatcher_lease / 3, runner.renew_leases, "lease renewal")),
            asyncio.create_task(self._every(s.dispatcher_lease / 3, runner.reap, "reaper", jitter=True)),
        ]
        await flush(nc)
        self._ready = True

    async def _every(
        self, period: float, job: Callable[[], Awaitable[Any]], what: str, *, jitter: bool = False
    ) -> None:
        while True:
            await asyncio.sleep(period * (random.uniform(0.5, 1.0) if jitter else 1.0))
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not expected_fault(exc, what):
                    log.exception(f"{what} failed; will try again")

    async def stop(self, grace: float = 10.0) -> None:
        """Stop taking work; let calls in progress finish within `grace` seconds in all (the
        requests being answered, then the calls running in tasks of their own, share it), then
        relay what the outbox holds for what is left of it, at least 1 s and at most 5 s. What is
        not done by then is not lost: leases lapse and another replica claims the calls, and the
        next relay sends the events."""
        self._ready = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        await self.bus.drain(grace)
        for task in self._loops:
            await cancel_and_wait(task)
        if self.runner is not None:
            await self.runner.stop(max(0.0, deadline - loop.time()))
        if self.relay is not None:
            await self.relay.drain(within=min(max(deadline - loop.time(), 1.0), 5.0))
        if self._http is not None:
            await self._http.aclose()
        if self._owns_pool and self._mcp_pool is not None:
            aclose = getattr(self._mcp_pool, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        await self.bus.close()
        for pipe in (self._pipe, self._relay_pipe):
            if pipe is not None:
                with contextlib.suppress(Exception):
                    await pipe.aclose()
        if self.redis is not None:
            with contextlib.suppress(Exception):
                await self.redis.aclose()  # type: ignore[attr-defined]  # stubs predate aclose


async def build(settings: DispatcherSettings) -> DispatcherApp:
    return DispatcherApp(settings)
