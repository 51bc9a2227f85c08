"""The console assembled: its settings read, the OIDC client, the live hub and the HTTP server
(`toolbus_common.runtime.HttpServer`), started and stopped with the approval service."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets

import httpx
from nats.aio.client import Client as NatsClient
from redis.asyncio import Redis
from toolbus_common.keys import Keys
from toolbus_common.logging import register_secret
from toolbus_common.runtime import HttpServer
from toolbus_common.settings import Settings

from toolbus_approval.approvals import Approvals
from toolbus_approval.console.access import Grants
from toolbus_approval.console.declarations import Declarations
from toolbus_approval.console.live import LiveHub, Scope
from toolbus_approval.console.oidc import OidcClient
from toolbus_approval.console.settings import ConsoleSettings
from toolbus_approval.console.web import Console, ConsoleConfig

log = logging.getLogger(__name__)


def session_key(settings: Settings) -> str:
    """The key that signs session cookies: derived from `TOOLBUS_SECRET_KEY` (so every replica
    reads every session), else one of this process alone (sessions end when it stops)."""
    if settings.secret_key is None:
        log.warning("console: TOOLBUS_SECRET_KEY unset, so sessions last only as long as this process")
        return secrets.token_urlsafe(32)
    first = settings.secret_key.get_secret_value().split(",")[0].strip()
    return hmac.new(first.encode(), b"toolbus console session v1", hashlib.sha256).hexdigest()


class ConsoleServer:
    """The console of one approval service process."""

    def __init__(self, own: ConsoleSettings) -> None:
        self.own = own
        self._grants = Grants(own.groups)  # a malformed map stops the start, before serving
        self._http: HttpServer | None = None
        self._client: httpx.AsyncClient | None = None
        self._hub: LiveHub | None = None
        self.url = ""

    async def start(
        self, settings: Settings, approvals: Approvals, nc: NatsClient, redis: Redis[bytes], keys: Keys
    ) -> None:
        own = self.own
        assert own.port is not None
        subjects = settings.subjects
        self._client = httpx.AsyncClient(timeout=10, follow_redirects=False)
        dev_token = own.dev_token.get_secret_value() if own.dev_token else None
        secret = own.oidc_client_secret.get_secret_value() if own.oidc_client_secret else None
        for value in (dev_token, secret):
            if value:
                register_secret(value)
        self._http = http = HttpServer(own.host, own.port, name="console")
        port = http.bind()
        self.url = (own.url or f"http://{own.host}:{port}").rstrip("/")
        oidc = None
        if own.oidc_issuer and own.oidc_client_id:
            oidc = OidcClient(
                issuer=own.oidc_issuer,
                client_id=own.oidc_client_id,
                client_secret=secret,
                redirect_uri=f"{self.url}/auth/callback",
                scopes=own.oidc_scopes,
                groups_claim=own.groups_claim,
                redis=redis,
                keys=keys,
                http=self._client,
            )
        self._hub = hub = LiveHub(nc, subjects, _scope(approvals))
        await hub.start()
        config = ConsoleConfig(
            public_url=self.url, session_key=session_key(settings), dev_token=dev_token, grants=self._grants
        )
        console = Console(approvals, config, oidc=oidc, hub=hub, declarations=Declarations(nc, subjects))
        await http.start(console.app())
        log.info("approval console serving", extra={"url": self.url, "port": port})

    async def stop(self) -> None:
        if self._hub is not None:
            await self._hub.stop()
        if self._http is not None:
            await self._http.stop()
        if self._client is not None:
            await self._client.aclose()


def _scope(approvals: Approvals) -> Scope:
    async def scope(approval_id: str) -> tuple[str | None, str | None, str] | None:
        stored = await approvals.get(approval_id)
        if stored is None:
            return None
        return stored.needed.toolset_id, stored.needed.namespace, stored.needed.tool

    return scope
