"""The credentials service assembled: NATS, JetStream, Redis, the request subjects and command
consumers (`toolbus_common.bus`), the outbox relay, the park-timeout sweep and the webhook sender."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import httpx
import orjson
from nats.aio.client import Client as NatsClient
from redis.asyncio import Redis
from starlette.routing import Route
from toolbus_common.bus import Bus, asyncapi_document
from toolbus_common.connections import (
    JsPlacement,
    connect_redis,
    connect_script_pipe,
    ensure_stream,
    internal_stream_limits,
)
from toolbus_common.credential_store import CredentialStore
from toolbus_common.egress import EgressPolicy
from toolbus_common.keys import Keys
from toolbus_common.outages import expected_fault
from toolbus_common.outbox import OutboxRelay
from toolbus_common.private.httpcore_guard import GuardedBackend, Resolver, guard_transport
from toolbus_common.secrets import Cipher
from toolbus_common.settings import Settings
from toolbus_common.signing import CommandSigner
from toolbus_common.tasks import cancel_and_wait
from toolbus_common.toolsets import ToolsetStore
from toolbus_common.webhooks import WebhookSender
from toolbus_contracts import Subjects
from toolbus_contracts.credentials import CredentialsConnected, CredentialsConnectFailed, CredentialsExpired
from toolbus_contracts.internal import CredentialsChanged

from toolbus_credentials.callback import callback_route, client_metadata_route, start_route
from toolbus_credentials.handlers import routes
from toolbus_credentials.oauth import OAuthConnections, client_metadata
from toolbus_credentials.parking import ParkingLot
from toolbus_credentials.service import CredentialsLogic
from toolbus_credentials.settings import CredentialsSettings

log = logging.getLogger(__name__)

QUEUE = "toolbus-credentials"
INTERNAL_STREAM = "INTERNAL"


def oauth_http(policy: EgressPolicy, timeout: float, resolver: Resolver | None = None) -> httpx.AsyncClient:
    """The client of OAuth discovery, registration, token and revocation requests (their URLs
    come from MCP servers and their metadata): redirects not followed, and every connection made
    to an address the deployment's egress policy allows, the one that was checked (the guarded
    transport of `http.fetch`: no second lookup, so no DNS-rebinding window). A refusal raises
    `HostNotAllowed` before any connection. `resolver`: tests put a stub in place of DNS."""
    transport = httpx.AsyncHTTPTransport()
    guard_transport(transport, GuardedBackend(policy, resolver))
    return httpx.AsyncClient(transport=transport, timeout=timeout, follow_redirects=False, trust_env=False)


class NatsOutbox:
    """The hints on core NATS: `credentials.changed` and the public events (a `CallsResume` goes
    through the service's outbox, `ParkingLot.resume`)."""

    def __init__(self, nc: NatsClient, subjects: Subjects) -> None:
        self._nc = nc
        self._subjects = subjects

    async def credentials_changed(self, message: CredentialsChanged) -> None:
        await self._nc.publish(self._subjects.internal_credentials_changed, message.wire_json())

    async def credentials_expired(self, event: CredentialsExpired) -> None:
        await self._nc.publish(self._subjects.credentials_expired, orjson.dumps(event.wire()))

    async def connected(self, event: CredentialsConnected) -> None:
        await self._nc.publish(self._subjects.credentials_connected, event.wire_json())

    async def failed(self, event: CredentialsConnectFailed) -> None:
        await self._nc.publish(self._subjects.credentials_failed, event.wire_json())


class CredentialsService:
    """`python -m toolbus_credentials`: see the package README."""

    name = "credentials"

    def __init__(self, settings: Settings, own: CredentialsSettings | None = None) -> None:
        self.settings = settings
        self.own = own or CredentialsSettings()
        # Start-up errors (missing or malformed key, webhook secret) surface here, before serving.
        self.cipher = Cipher.from_settings(settings)
        self.subjects = settings.subjects
        self.keys = Keys(settings.key_prefix)
        self.bus = Bus(settings, name="credentials", queue=QUEUE)
        self._redis: Redis[bytes] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._notifier: asyncio.Task[None] | None = None
        self._ready = False
        self.logic: CredentialsLogic | None = None
        self.webhooks: WebhookSender | None = None
        self.oauth: OAuthConnections | None = None
        self._http: httpx.AsyncClient | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._relay: OutboxRelay | None = None

    async def start(self) -> None:
        settings, own = self.settings, self.own
        self._redis = redis = connect_redis(settings)
        nc = await self.bus.connect()
        js = nc.jetstream()
        stream = settings.js_name(INTERNAL_STREAM)
        await ensure_stream(js, stream, [self.subjects.internal_all], **internal_stream_limits(settings))
        toolsets = ToolsetStore(js, settings.js_name("toolsets"), placement=JsPlacement.of(settings))
        await toolsets.open()

        async def server_names(toolset_id: str) -> frozenset[str] | None:
            stored = await toolsets.get(toolset_id)
            return None if stored is None else frozenset(s.name for s in stored.pinned.servers)

        self.webhooks = WebhookSender(
            redis,
            self.keys,
            url=settings.webhook_url,
            secret=settings.webhook_secret,
            schedule=own.webhook_retry_schedule,
            timeout=own.webhook_timeout_seconds,
        )
        outbox = NatsOutbox(nc, self.subjects)
        relay_pipe = connect_script_pipe(settings, redis)
        self._relay = OutboxRelay(
            redis,
            nc,
            self.keys.parked_outbox,
            f"credentials-{uuid.uuid4().hex[:8]}",
            lock=self.keys.parked_outbox_relay_lock,
            pipe=relay_pipe,
            signer=CommandSigner.of(settings),
            commands=self.subjects.internal_all.removesuffix(">"),
        )
        self._relay.start("credentials-outbox-relay")
        self.logic = logic = CredentialsLogic(
            redis=redis,
            keys=self.keys,
            store=CredentialStore(redis, self.keys, self.cipher),
            parking=ParkingLot(redis, self.keys, self.subjects),
            server_names=server_names,
            outbox=outbox,
            webhooks=self.webhooks,
            park_timeout=own.park_timeout_seconds,
            notify_delay=own.park_notify_seconds,
        )

        async def server_urls(toolset_id: str) -> dict[str, str] | None:
            stored = await toolsets.get(toolset_id)
            return None if stored is None else {s.name: s.url for s in stored.pinned.servers}

        self._http = oauth_http(settings.egress, own.webhook_timeout_seconds)
        self.oauth = logic.oauth = OAuthConnections(
            redis=redis,
            keys=self.keys,
            cipher=self.cipher,
            http=self._http,
            outbox=outbox,
            patch=logic.patch_server,
            server_urls=server_urls,
            run_target=logic.run_target,
            callback_url=own.oauth_callback_url,
            state_ttl=own.oauth_state_seconds,
            link_ttl=own.oauth_link_seconds,
            refresh_margin=own.oauth_margin_seconds,
            client_name=own.oauth_client_name,
        )
        self._refresher = asyncio.create_task(self._refresh_loop(), name="oauth-refresh")
        await self.webhooks.start()
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="park-timeout-sweep")
        self._notifier = asyncio.create_task(self._notify_loop(), name="expiry-notices")
        self.bus.include(routes, logic)
        await self.bus.start()
        self._ready = True

    async def _sweep_loop(self) -> None:
        assert self.logic is not None
        while True:
            try:
                await self.logic.expire_parked()
            except Exception as exc:
                if not expected_fault(exc, "park timeout sweep"):
                    log.exception("park timeout sweep failed; retrying")
            await asyncio.sleep(self.own.park_sweep_seconds)

    async def _notify_loop(self) -> None:
        assert self.logic is not None
        interval = min(self.own.park_notify_seconds, 0.25)
        while True:
            try:
                await self.logic.send_due_notices()
            except Exception as exc:
                if not expected_fault(exc, "credentials.expired notices"):
                    log.exception("sending credentials.expired notices failed; retrying")
            await asyncio.sleep(interval)

    async def _refresh_loop(self) -> None:
        assert self.oauth is not None
        while True:
            try:
                await self.oauth.refresh_due()
            except Exception as exc:
                if not expected_fault(exc, "renewing OAuth tokens"):
                    log.exception("renewing OAuth tokens failed; retrying")
            await asyncio.sleep(self.own.oauth_interval_seconds)

    def http_routes(self) -> list[Route]:
        """`GET /oauth/callback`, `GET /oauth/start/<token>` and `GET /oauth/client-metadata.json`
        on the service's HTTP port."""

        async def handle(params: dict[str, str]) -> tuple[bool, str]:
            if self.oauth is None:  # the HTTP port opens before the service has started
                return False, "toolbus is starting; open the link again in a moment."
            return await self.oauth.callback(params)

        async def begin(token: str) -> str | None:
            return None if self.oauth is None else await self.oauth.start(token)

        def document() -> dict[str, object] | None:
            return client_metadata(self.own.oauth_callback_url, self.own.oauth_client_name)

        return [callback_route(handle), start_route(begin), client_metadata_route(document)]

    def ready(self) -> bool:
        return self._ready and self.bus.ready()

    def asyncapi(self) -> dict[str, Any]:
        return asyncapi_document(self.settings, [routes], title="toolbus credentials")

    async def stop(self) -> None:
        self._ready = False
        await self.bus.drain()
        for task in (self._sweeper, self._notifier, self._refresher):
            if task is not None:
                await cancel_and_wait(task)
        if self._relay is not None:
            await self._relay.stop(within=2.0)
        if self.webhooks is not None:
            await self.webhooks.stop()
        await self.bus.close()
        if self._http is not None:
            await self._http.aclose()
        if self._redis is not None:
            await self._redis.aclose()  # type: ignore[attr-defined]


async def build(settings: Settings) -> CredentialsService:
    return CredentialsService(settings)
