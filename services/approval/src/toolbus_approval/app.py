"""The approval service assembled: NATS and Redis connections, the INTERNAL stream and its two
durable consumers, the request routes, the webhook sender and the sweeper (expiry and retries)."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import orjson
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from redis.asyncio import Redis
from toolbus_common.bus import Bus, asyncapi_document
from toolbus_common.connections import JsPlacement, connect_redis, ensure_stream, internal_stream_limits
from toolbus_common.keys import Keys
from toolbus_common.outages import expected_fault
from toolbus_common.settings import Settings
from toolbus_common.signing import CommandSigner
from toolbus_common.tasks import cancel_and_wait
from toolbus_common.toolsets import ToolsetStore
from toolbus_common.webhooks import WebhookSender
from toolbus_contracts import Subjects
from toolbus_contracts.approvals import ApprovalRequested
from toolbus_contracts.internal import ApprovalDecided

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
RETRY_AFTER = timedelta(seconds=5)
"""How old an unsent announcement or decision must be before the sweeper sends it (the request
that queued it normally sends it within milliseconds)."""
LIST_SLACK = 4096
"""Bytes of an `approvals.list` reply kept for its envelope and `nextCursor`."""


class NatsOutlet:
    """Publishes `approval.requested` with core NATS (the EVENTS stream captures it, deduplicated by
    message id) and decisions with a JetStream publish that waits for the INTERNAL stream's ack."""

    def __init__(
        self,
        nc: NatsClient,
        js: JetStreamContext,
        subjects: Subjects,
        internal_stream: str,
        signer: CommandSigner,
    ) -> None:
        self._nc = nc
        self._js = js
        self._subjects = subjects
        self._stream = internal_stream
        self._signer = signer

    async def publish_requested(self, event: ApprovalRequested) -> None:
        headers = {"Nats-Msg-Id": f"approval-requested-{event.approval_id}"}
        await self._nc.publish(
            self._subjects.approvals_requested, orjson.dumps(event.wire()), headers=headers
        )

    async def publish_decided(self, decided: ApprovalDecided) -> None:
        subject = self._subjects.internal_approval_decisions
        body = decided.wire_json()
        headers = self._signer.headers(subject, body, f"approval-decided-{decided.approval_id}")
        await self._js.publish(subject, body, stream=self._stream, headers=headers, timeout=5.0)


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
        self._webhooks = WebhookSender(
            redis,
            keys,
            url=s.webhook_url,
            secret=s.webhook_secret,
            schedule=self.approval_settings.webhook_retry_schedule,
            timeout=self.approval_settings.webhook_timeout_seconds,
        )
        toolsets = ToolsetStore(js, s.js_name("toolsets"), placement=JsPlacement.of(s))
        await toolsets.open()
        self.approvals = approvals = Approvals(
            ApprovalStore(redis, keys),
            NatsOutlet(nc, js, subjects, stream, CommandSigner.of(self.settings)),
            webhooks=self._webhooks if self._webhooks.enabled else None,
            timeout=self.approval_settings.timeout,
            list_budget=nc.max_payload - LIST_SLACK,
            edits=EditCheck(PinnedSchemas(toolsets)),
            identity=Identity(trust_request_info=self.approval_settings.approval_trust_request_info),
            remembered=RememberedStore(redis, keys),
        )
        # What a previous process stored but did not send goes out before anything new.
        try:
            sent = await approvals.flush(older_than=None)
            if sent:
                log.info("unsent approvals and decisions sent", extra={"count": sent})
        except Exception as exc:  # the sweeper retries them; serving must not wait for it
            if not expected_fault(exc, "unsent approvals not sent yet"):
                log.exception("unsent approvals not sent yet")
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
                await approvals.flush(older_than=RETRY_AFTER)
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
