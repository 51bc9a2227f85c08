"""The approval service assembled: NATS and Redis connections, the INTERNAL stream and its two
durable consumers, the request routes, the outbox relay, the webhook sender and the expiry sweeper."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from redis.asyncio import Redis
from toolbus_common.bus import Bus, asyncapi_document
from toolbus_common.connections import (
    JsPlacement,
    connect_redis,
    connect_script_pipe,
    ensure_stream,
    events_stream_limits,
    internal_stream_limits,
)
from toolbus_common.keys import Keys
from toolbus_common.outages import expected_fault
from toolbus_common.outbox import OutboxRelay
from toolbus_common.settings import Settings
from toolbus_common.signing import CommandSigner
from toolbus_common.tasks import cancel_and_wait
from toolbus_common.toolsets import ToolsetStore
from toolbus_common.webhooks import WebhookSender

from toolbus_approval.approvals import Approvals
from toolbus_approval.console.server import ConsoleServer
from toolbus_approval.console.settings import ConsoleSettings
from toolbus_approval.edits import EditCheck
from toolbus_approval.handlers import routes
from toolbus_approval.identity import Identity
from toolbus_approval.remembered import RememberedStore
from toolbus_approval.settings import ApprovalSettings
from toolbus_approval.store import ApprovalStore

log = logging.getLogger(__name__)

QUEUE = "toolbus-approval"
INTERNAL_STREAM = "INTERNAL"
LIST_SLACK = 4096
"""Bytes of an `approvals.list` reply kept for its envelope and `nextCursor`."""


class PinnedSchemas:
    """Tools' input schemas from the toolsets object store (`edits.Schemas`)."""

    def __init__(self, toolsets: ToolsetStore) -> None:
        self._toolsets = toolsets

    async def input_schema(self, toolset_id: str, tool: str) -> dict[str, Any] | None:
        stored = await self._toolsets.get(toolset_id)
        found = stored.table.get(tool) if stored is not None else None
        return None if found is None else found.info.input_schema


class ApprovalApp:
    """The running service (`toolbus_common.runtime.Service`): ready once connected, its command
    consumers and its routes subscribed (`toolbus_common.bus`)."""

    name = "approval"

    def __init__(
        self,
        settings: Settings,
        approval_settings: ApprovalSettings | None = None,
        console_settings: ConsoleSettings | None = None,
    ) -> None:
        self.settings = settings
        self.approval_settings = approval_settings or ApprovalSettings()
        own = console_settings or ConsoleSettings()
        self.console = ConsoleServer(own) if own.enabled else None
        self.bus = Bus(settings, name="approval", queue=QUEUE)
        self._redis: Redis[bytes] | None = None
        self._webhooks: WebhookSender | None = None
        self._relay: OutboxRelay | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._ready = False
        self.approvals: Approvals | None = None

    async def start(self) -> None:
        s = self.settings
        subjects = s.subjects
        nc = await self.bus.connect()
        js = nc.jetstream()
        self._redis = redis = connect_redis(s)
        keys = Keys(s.key_prefix)
        stream = s.js_name(INTERNAL_STREAM)
        await ensure_stream(js, stream, [subjects.internal_all], **internal_stream_limits(s))
        # approval.requested is relayed with JetStream's ack: the stream that stores it must exist
        # even before the dispatcher (which owns it) first started.
        await ensure_stream(js, s.js_name("EVENTS"), [subjects.all_events], **events_stream_limits(s))
        self._webhooks = WebhookSender(
            redis,
            keys,
            url=s.webhook_url,
            secret=s.webhook_secret,
            schedule=self.approval_settings.webhook_retry_schedule,
            timeout=self.approval_settings.webhook_timeout_seconds,
            queue=(keys.approvals_webhooks_due, keys.approvals_webhook),
        )
        toolsets = ToolsetStore(js, s.js_name("toolsets"), placement=JsPlacement.of(s))
        await toolsets.open()
        relay_pipe = connect_script_pipe(s, redis)
        self._relay = OutboxRelay(
            redis,
            nc,
            keys.approvals_outbox,
            f"approval-{uuid.uuid4().hex[:8]}",
            lock=keys.approvals_outbox_relay_lock,
            pipe=relay_pipe,
            signer=CommandSigner.of(s),
            commands=subjects.internal_all.removesuffix(">"),
        )
        store = ApprovalStore(redis, keys, subjects, webhooks=self._webhooks.enabled)
        self.approvals = approvals = Approvals(
            store,
            announced=self._webhooks.wake,
            timeout=self.approval_settings.timeout,
            list_budget=nc.max_payload - LIST_SLACK,
            edits=EditCheck(PinnedSchemas(toolsets)),
            identity=Identity(trust_request_info=self.approval_settings.approval_trust_request_info),
            remembered=RememberedStore(redis, keys),
        )
        # What a previous process owed waits in the outbox: the relay sends it (and all that follows).
        try:
            adopted = await store.adopt_legacy_queues(int(time.time() * 1000))
            if adopted:
                log.info(
                    "unsent approvals and decisions of an earlier version owed", extra={"count": adopted}
                )
        except Exception as exc:  # left queued: the next start adopts them; serving must not wait
            if not expected_fault(exc, "approvals of an earlier version not adopted yet"):
                log.exception("approvals of an earlier version not adopted yet")
        self._relay.start("approval-outbox-relay")
        self.bus.include(routes, approvals)
        await self.bus.start()
        if self.console is not None:
            await self.console.start(s, approvals, nc, redis, keys)
        await self._webhooks.start()
        self._sweeper = asyncio.create_task(self._sweep(approvals), name="approval-sweeper")
        self._ready = True

    async def _sweep(self, approvals: Approvals) -> None:
        interval = self.approval_settings.approval_sweep_interval
        while True:
            await asyncio.sleep(interval)
            try:
                await approvals.expire_due()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis or NATS briefly away: the next sweep tries again
                if not expected_fault(exc, "approval sweep"):
                    log.exception("approval sweep failed; the next one tries again")

    async def stop(self) -> None:
        self._ready = False
        if self.console is not None:
            await self.console.stop()
        await self.bus.drain()
        if self._sweeper is not None:
            await cancel_and_wait(self._sweeper)
        if self._relay is not None:
            await self._relay.stop(within=2.0)
        if self._webhooks is not None:
            await self._webhooks.stop()
        await self.bus.close()
        if self._redis is not None:
            await self._redis.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag

    def ready(self) -> bool:
        return self._ready and self.bus.ready()

    def asyncapi(self) -> dict[str, Any]:
        return asyncapi_document(self.settings, [routes], title="toolbus approval")


async def build(settings: Settings) -> ApprovalApp:
    """The app factory `run_service` calls: settings are read here, not at import."""
    return ApprovalApp(settings, ApprovalSettings())
