"""What the credentials service does, with no NATS in it: set credentials at a level, park calls
that met a 401, resume them on a set at the same level and scope, end those parked too long, and
forget a closed run.

A crash anywhere loses nothing (at-least-once): credentials are stored before parked calls are
resumed, and a `CallsResume` is written with the unparking it follows (`ParkingLot.resume`, the
service's outbox); the dispatcher ignores a resume of a call that is no longer parked. The hints
(`credentials.changed`, the public events) go through `Outbox` (core NATS in the app).
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Protocol

from redis.asyncio import Redis
from toolbus_common.credential_store import CredentialStore, scope_of
from toolbus_common.keys import Keys
from toolbus_common.webhooks import WebhookSender
from toolbus_contracts.credentials import (
    CredentialLevel,
    Credentials,
    CredentialsExpired,
    CredentialsExpiredData,
    CredentialsSetReply,
    NamespaceCredentialsSetRequest,
    RunCredentialsSetRequest,
    ServerCredentials,
    ToolsetCredentialsSetRequest,
)
from toolbus_contracts.errors import InvalidRequest, NotFound
from toolbus_contracts.internal import CallParked, CallsResume, CredentialsChanged, RunClosed

from toolbus_credentials.oauth import OAuthConnections, Target
from toolbus_credentials.parking import ParkingLot

log = logging.getLogger(__name__)

ServerNames = Callable[[str], Awaitable[frozenset[str] | None]]
"""Toolset id -> the names of its MCP servers, or None when the toolset is unknown."""


class Outbox(Protocol):
    """Where the service's messages go."""

    async def credentials_changed(self, message: CredentialsChanged) -> None:
        """Broadcast (core NATS) to every dispatcher."""

    async def credentials_expired(self, event: CredentialsExpired) -> None:
        """The public `‹p›.events.credentials.expired` event."""


class RunInfo:
    __slots__ = ("namespace", "open", "toolset_id")

    def __init__(self, toolset_id: str, namespace: str | None, open_: bool) -> None:
        self.toolset_id = toolset_id
        self.namespace = namespace
        self.open = open_


class CredentialsLogic:
    """The credentials service's behaviour over Redis, a toolset lookup, an outbox and a webhook
    sender."""

    def __init__(
        self,
        *,
        redis: Redis[bytes],
        keys: Keys,
        store: CredentialStore,
        parking: ParkingLot,
        server_names: ServerNames,
        outbox: Outbox,
        webhooks: WebhookSender,
        park_timeout: float,
        notify_delay: float = 1.0,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self.store = store
        self.parking = parking
        self._server_names = server_names
        self._outbox = outbox
        self._webhooks = webhooks
        self.park_timeout = park_timeout
        self.notify_delay = notify_delay
        self._holder = uuid.uuid4().hex
        self.oauth: OAuthConnections | None = None
        """OAuth connections (set by the app once built: they patch headers through this object)."""

    # ---- sets ------------------------------------------------------------------------------------

    async def set_toolset(self, request: ToolsetCredentialsSetRequest) -> CredentialsSetReply:
        await self._check_servers(request.toolset_id, request.credentials)
        return await self._set("toolset", request.credentials, toolset_id=request.toolset_id)

    async def set_namespace(self, request: NamespaceCredentialsSetRequest) -> CredentialsSetReply:
        await self._check_servers(request.toolset_id, request.credentials)
        return await self._set(
            "namespace", request.credentials, toolset_id=request.toolset_id, namespace=request.namespace
        )

    async def set_run(self, request: RunCredentialsSetRequest) -> CredentialsSetReply:
        run = await self.run_info(request.run_id)
        if run is None or not run.open:
            hint = (
                "was closed; open a run with a new id"
                if run is not None
                else "is unknown: open it with runs.open first"
            )
            raise NotFound(f"Run '{request.run_id}' {hint}.", details={"runId": request.run_id})
        await self._check_servers(run.toolset_id, request.credentials)
        return await self._set(
            "run",
            request.credentials,
            toolset_id=run.toolset_id,
            namespace=run.namespace,
            run_id=request.run_id,
        )

    async def _set(
        self,
        level: CredentialLevel,
        credentials: Credentials,
        *,
        toolset_id: str,
        namespace: str | None = None,
        run_id: str | None = None,
    ) -> CredentialsSetReply:
        if self.oauth is not None:
            credentials = await self._with_connections(
                Target(level=level, toolset_id=toolset_id, namespace=namespace, run_id=run_id), credentials
            )
        version = await self.store.set(
            level, toolset_id=toolset_id, namespace=namespace, run_id=run_id, credentials=credentials
        )
        scope = scope_of(level, toolset_id=toolset_id, namespace=namespace, run_id=run_id)
        # Before collecting the parked calls: a park recorded after this line sees the new version
        # and is resumed at once (`park`); one recorded before it is collected below.
        await self.parking.note_set(level, scope, version)
        parked = await self.parking.parked_at(level, scope)
        if parked:
            await self.parking.resume(CallsResume(call_ids=parked))
        await self._outbox.credentials_changed(
            CredentialsChanged(
                level=level,
                toolset_id=toolset_id,
                namespace=namespace if level != "toolset" else None,
                run_id=run_id,
            )
        )
        log.info(
            "credentials set",
            extra={
                "credentialsLevel": level,
                "toolsetId": toolset_id,
                "runId": run_id,
                "resumed": len(parked),
            },
        )
        return CredentialsSetReply(level=level)

    async def _with_connections(self, target: Target, credentials: Credentials) -> Credentials:
        """A set replaces the level's headers: a server it names loses its OAuth connection there;
        a connected server it does not name keeps its current bearer header."""
        assert self.oauth is not None
        servers = dict(credentials.servers)
        for server in await self.oauth.servers(target):
            if server in servers:
                await self.oauth.forget(target, server)
                continue
            connection = await self.oauth.load(target, server)
            if connection is not None:
                servers[server] = ServerCredentials.model_validate(
                    {"headers": {"Authorization": f"Bearer {connection.access_token}"}}
                )
        return Credentials(servers=servers)

    async def patch_server(self, target: Target, server: str, headers: dict[str, str] | None) -> None:
        """Write one server's headers at a level and scope (an OAuth token) and resume the calls
        parked there for that server."""
        version = await self.store.set_server(
            target.level,
            toolset_id=target.toolset_id,
            namespace=target.namespace,
            run_id=target.run_id,
            server=server,
            headers=headers,
        )
        await self.parking.note_set(target.level, target.scope, version)
        parked = await self.parking.parked_for(target.level, target.scope, server)
        if parked and headers is not None:
            await self.parking.resume(CallsResume(call_ids=parked))
        await self._outbox.credentials_changed(
            CredentialsChanged(
                level=target.level,
                toolset_id=target.toolset_id,
                namespace=target.namespace if target.level != "toolset" else None,
                run_id=target.run_id,
            )
        )
        if parked:
            log.info(
                "oauth token stored",
                extra={"credentialsLevel": target.level, "server": server, "resumed": len(parked)},
            )

    async def run_target(self, run_id: str) -> Target | None:
        run = await self.run_info(run_id)
        if run is None or not run.open:
            return None
        return Target(level="run", toolset_id=run.toolset_id, namespace=run.namespace, run_id=run_id)

    async def _check_servers(self, toolset_id: str, credentials: Credentials) -> None:
        names = await self._server_names(toolset_id)
        if names is None:
            raise NotFound(
                f"Toolset '{toolset_id}' does not exist: register it with toolsets.create first.",
                details={"toolsetId": toolset_id},
            )
        for server in sorted(credentials.servers):
            if server not in names:
                known = ", ".join(sorted(names)) or "none"
                raise InvalidRequest(
                    f"Field 'credentials.servers.{server}' is invalid: the toolset has no MCP server "
                    f"'{server}' (its servers: {known}).",
                    details={"field": f"credentials.servers.{server}"},
                )

    async def run_info(self, run_id: str) -> RunInfo | None:
        raw = await self._redis.hmget(self._keys.run(run_id), ["toolsetId", "namespace", "state"])
        toolset_id, namespace, state = (v.decode() if v is not None else None for v in raw)
        if toolset_id is None:
            return None
        return RunInfo(toolset_id, namespace or None, state != "closed")

    # ---- parking ---------------------------------------------------------------------------------

    async def park(self, message: CallParked) -> None:
        """Park the call at its level+scope. The first call parked there for its server schedules
        one `credentials.expired` notice (event + webhook) after the notify delay, so a burst of
        401s at one scope gives one notice listing them all."""
        run = await self.run_info(message.run_id)
        if run is not None and not run.open:
            log.info(
                "parked call of a closed run dropped",
                extra={"runId": message.run_id, "callId": message.call_id},
            )
            return
        if self.oauth is not None and await self.oauth.on_rejected(message):
            # A connected server refused the token: renewed once, the call goes again at once.
            await self.parking.resume(CallsResume(call_ids=[message.call_id]))
            log.info(
                "call resumed after renewing its OAuth token",
                extra={"callId": message.call_id, "runId": message.run_id, "server": message.server},
            )
            return
        scope = scope_of(
            message.level, toolset_id=message.toolset_id, namespace=message.namespace, run_id=message.run_id
        )
        result = await self.parking.park(
            call_id=message.call_id,
            run_id=message.run_id,
            server=message.server,
            level=message.level,
            scope=scope,
            toolset_id=message.toolset_id,
            namespace=message.namespace,
            notify_delay_ms=int(self.notify_delay * 1000),
            credentials_version=message.credentials_version,
        )
        if result.stale:
            # Credentials were set there after the failing attempt, before this park was recorded:
            # that set resumed nothing, so resume the call now (the dispatcher holds it parked).
            await self.parking.resume(CallsResume(call_ids=[message.call_id]))
            log.info(
                "parked call resumed at once: newer credentials were set meanwhile",
                extra={"callId": message.call_id, "runId": message.run_id, "credentialsLevel": message.level},
            )
            return
        log.info(
            "call parked",
            extra={
                "callId": message.call_id,
                "runId": message.run_id,
                "credentialsLevel": message.level,
                "server": message.server,
            },
        )

    async def send_due_notices(self, now: float | None = None) -> int:
        """Publish `credentials.expired` and queue its webhook for every notice now due, listing
        the calls parked at that scope for that server at this moment; returns how many went out."""
        now_ms = int((now if now is not None else time.time()) * 1000)
        sent = 0
        for notice in await self.parking.claim_notices(now_ms):
            call_ids = await self.parking.parked_for(notice.level, notice.scope, notice.server)
            if call_ids:
                reconnect = None
                if self.oauth is not None:
                    target = Target(
                        level=notice.level,
                        toolset_id=notice.toolset_id,
                        namespace=notice.namespace if notice.level != "toolset" else None,
                        run_id=notice.run_id if notice.level == "run" else None,
                    )
                    reconnect = await self.oauth.reconnect_url(target, notice.server)
                event = CredentialsExpired(
                    data=CredentialsExpiredData(
                        toolset_id=notice.toolset_id,
                        namespace=notice.namespace,
                        run_id=notice.run_id,
                        server=notice.server,
                        level=notice.level,
                        call_ids=call_ids,
                        authorization_url=reconnect[0] if reconnect else None,
                        connection_id=reconnect[1] if reconnect else None,
                    )
                )
                await self._outbox.credentials_expired(event)
                # The same notice always gives the same webhook id: a retry after a crash here
                # never sends a second webhook.
                digest = hashlib.sha256(
                    "\0".join((notice.level, notice.scope, notice.server, notice.trigger)).encode()
                ).hexdigest()[:32]
                await self._webhooks.enqueue(
                    "credentials.expired", event.data.wire(), webhook_id=f"msg_{digest}"
                )
                sent += 1
                log.warning(
                    "credentials expired",
                    extra={
                        "credentialsLevel": notice.level,
                        "server": notice.server,
                        "runId": notice.run_id,
                        "calls": len(call_ids),
                    },
                )
            await self.parking.notice_done(notice)
        return sent

    async def expire_parked(self, now: float | None = None) -> list[str]:
        """End the calls parked longer than the park timeout with `credentialsRejected`; returns
        their ids. One replica at a time (a Redis lock)."""
        if not await self.parking.try_sweep_lock(self._holder, ttl_ms=30_000):
            return []
        cutoff = int(((now if now is not None else time.time()) - self.park_timeout) * 1000)
        ended: list[str] = []
        while True:
            ids = await self.parking.older_than(cutoff)
            if not ids:
                break
            await self.parking.resume(CallsResume(call_ids=ids, reason="credentialsRejected"))
            ended.extend(ids)
        await self.parking.release_sweep_lock(self._holder)
        if ended:
            log.warning("parked calls ended: parked too long", extra={"calls": len(ended)})
        return ended

    async def run_closed(self, message: RunClosed) -> None:
        """Forget the run: its parked calls (the dispatcher cancels them) and run credentials."""
        ids = set(await self.parking.of_run(message.run_id)) | set(message.call_ids)
        removed = await self.parking.remove(sorted(ids))
        await self.store.delete_run(message.run_id)
        if self.oauth is not None:
            run = await self.run_info(message.run_id)
            if run is not None:
                target = Target(
                    level="run", toolset_id=run.toolset_id, namespace=run.namespace, run_id=message.run_id
                )
                for server in await self.oauth.servers(target):
                    await self.oauth.forget(target, server)
        await self._redis.delete(self._keys.credentials_set_version("run", message.run_id))
        log.info("run closed", extra={"runId": message.run_id, "unparked": len(removed)})
