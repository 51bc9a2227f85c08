"""OAuth connections: a kind of credentials for one server at one level and scope, whose access
token the credentials service keeps fresh and writes as that server's `Authorization: Bearer`
header in the level's credentials document (so the dispatcher resolves it like any header).

Promises: a pending authorization (`state`) is single-use (GETDEL), short-lived (TTL) and bound to
its level, scope and server; tokens, codes, verifiers and client secrets reach Redis only
encrypted and never a reply, event or log; one replica renews a token at a time (a Redis lock
per connection) and a token renewed by another replica is not renewed again; a refresh that fails
for good marks the connection `expired`, and the `credentials.expired` notice then carries a new
authorization URL; connecting there stores the tokens and resumes the calls parked for the server.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Literal, Protocol

import httpx
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict
from redis.asyncio import Redis
from toolbus_common.credential_store import index_encrypted, scope_of, unindex_encrypted
from toolbus_common.keys import Keys
from toolbus_common.secrets import Cipher, DecryptionError
from toolbus_contracts.credentials import (
    CredentialLevel,
    CredentialsConnected,
    CredentialsConnectFailed,
    CredentialsConnectionData,
    CredentialsConnectReply,
    CredentialsConnectRequest,
    CredentialsDisconnectReply,
    CredentialsDisconnectRequest,
    CredentialsStatusReply,
    CredentialsTarget,
    OAuthConnectionStatus,
    OAuthGrant,
)
from toolbus_contracts.errors import InvalidRequest, NotFound, Unavailable
from toolbus_contracts.internal import CallParked

from toolbus_credentials import oauth_protocol as proto
from toolbus_credentials.oauth_protocol import ClientInfo, OAuthFailure, ServerAuth, Tokens

log = logging.getLogger(__name__)

REFRESHES = Counter(
    "toolbus_oauth_refreshes_total", "OAuth access-token renewals by outcome", ["reason", "outcome"]
)
STEP_UP_MAX = 64
"""At most this many scopes asked for by step-up challenges since an end user last connected."""
CONNECTS = Counter("toolbus_oauth_connections_total", "OAuth callbacks by outcome", ["outcome"])


class Target(BaseModel):
    """A level and scope resolved from a request."""

    model_config = ConfigDict(frozen=True)

    level: CredentialLevel
    toolset_id: str
    namespace: str | None
    run_id: str | None

    @property
    def scope(self) -> str:
        return scope_of(self.level, toolset_id=self.toolset_id, namespace=self.namespace, run_id=self.run_id)


class Flow(BaseModel):
    """A pending authorization, stored encrypted under the digest of its `state`."""

    connection_id: str
    target: Target
    server: str
    auth: dict[str, object]
    client_id: str
    client_secret: str | None
    verifier: str
    redirect_uri: str
    scopes: list[str]


class Start(BaseModel):
    """An authorization not yet begun: what `GET /oauth/start/<token>` needs to make a `state` and
    a verifier and send the browser on to the authorization server. Stored encrypted under the
    digest of its token, single-use, for `link_ttl`."""

    connection_id: str
    target: Target
    server: str
    auth: dict[str, object]
    client_id: str
    client_secret: str | None
    scopes: list[str]


class Connection(BaseModel):
    """A connected server's tokens and how to renew them, stored encrypted."""

    connection_id: str
    target: Target
    server: str
    grant: OAuthGrant
    auth: dict[str, object]
    client_id: str
    client_secret: str | None
    scopes: list[str]
    requested_scopes: list[str]
    access_token: str
    refresh_token: str | None
    expires_at: float | None
    connected_at: float
    last_refresh_at: float | None = None
    status: Literal["connected", "expired"] = "connected"
    allowed_scopes: list[str] | None = None
    """clientCredentials: the scopes the operator allowed at connect (`scopes` + `maxScopes`); a
    step-up never asks for more (None, a record from before: the scopes asked at connect)."""
    renewed_on_reject: bool = False
    """The current token came from a refresh made because a call was refused: a second refusal
    with it parks the call (no refresh loop on a 403 no new token of the same scope fixes)."""

    def server_auth(self) -> ServerAuth:
        return ServerAuth(**self.auth)  # type: ignore[arg-type]

    def client(self) -> ClientInfo:
        return ClientInfo(self.client_id, self.client_secret)


class Outbox(Protocol):
    async def connected(self, event: CredentialsConnected) -> None: ...

    async def failed(self, event: CredentialsConnectFailed) -> None: ...


Patch = Callable[[Target, str, dict[str, str] | None], Awaitable[None]]
"""Write (or remove) a server's headers at a level and scope and resume the calls parked there
for that server."""
ServerUrls = Callable[[str], Awaitable[dict[str, str] | None]]
RunTarget = Callable[[str], Awaitable[Target | None]]


def client_metadata_url(callback_url: str | None) -> str | None:
    """The URL of toolbus's Client ID Metadata Document, beside the callback, used as its
    `client_id` where the authorization server supports that; None unless the callback URL is
    HTTPS (the draft requires an HTTPS client id)."""
    if callback_url is None or not callback_url.startswith("https://"):
        return None
    return callback_url.rsplit("/", 1)[0] + "/client-metadata.json"


def client_metadata(callback_url: str | None, client_name: str) -> dict[str, object] | None:
    """The document served at `client_metadata_url`, or None when there is none."""
    url = client_metadata_url(callback_url)
    if url is None or callback_url is None:
        return None
    return proto.client_metadata(url, callback_url, client_name)


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _member(target: Target, server: str) -> str:
    return "\0".join((target.level, target.scope, server))


class OAuthConnections:
    """Connect, call back, renew, report and disconnect OAuth connections."""

    def __init__(
        self,
        *,
        redis: Redis[bytes],
        keys: Keys,
        cipher: Cipher,
        http: httpx.AsyncClient,
        outbox: Outbox,
        patch: Patch,
        server_urls: ServerUrls,
        run_target: RunTarget,
        callback_url: str | None,
        state_ttl: float = 600.0,
        link_ttl: float = 86_400.0,
        refresh_margin: float = 60.0,
        client_name: str = "toolbus",
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._cipher = cipher
        self._http = http
        self._outbox = outbox
        self._patch = patch
        self._server_urls = server_urls
        self._run_target = run_target
        self.callback_url = callback_url
        self.state_ttl = state_ttl
        self.link_ttl = link_ttl
        self.refresh_margin = refresh_margin
        self.client_name = client_name
        self._holder = uuid.uuid4().hex
        self._unlock = redis.register_script(
            "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
        )
        self.refreshes = 0
        """Refresh grants this replica sent (for tests and the bench; the metric has them too)."""

    # ---- targets -----------------------------------------------------------------------------

    async def target(self, request: CredentialsTarget) -> Target:
        if request.run_id is not None:
            if request.toolset_id is not None or request.namespace is not None:
                raise InvalidRequest(
                    "Field 'runId' is invalid: give runId alone (the run names its toolset and namespace).",
                    details={"field": "runId"},
                )
            found = await self._run_target(request.run_id)
            if found is None:
                raise NotFound(
                    f"Run '{request.run_id}' is unknown or closed.", details={"runId": request.run_id}
                )
            return found
        if request.toolset_id is None:
            raise InvalidRequest(
                "Field 'toolsetId' is required (or runId for the run level).", details={"field": "toolsetId"}
            )
        level: CredentialLevel = "namespace" if request.namespace else "toolset"
        return Target(level=level, toolset_id=request.toolset_id, namespace=request.namespace, run_id=None)

    async def _server_url(self, target: Target, server: str) -> str:
        urls = await self._server_urls(target.toolset_id)
        if urls is None:
            raise NotFound(
                f"Toolset '{target.toolset_id}' does not exist: register it with toolsets.create first.",
                details={"toolsetId": target.toolset_id},
            )
        if server not in urls:
            raise InvalidRequest(
                f"Field 'server' is invalid: the toolset has no MCP server '{server}'.",
                details={"field": "server"},
            )
        return urls[server]

    # ---- connect -----------------------------------------------------------------------------

    async def connect(self, request: CredentialsConnectRequest) -> CredentialsConnectReply:
        target = await self.target(request)
        url = await self._server_url(target, request.server)
        try:
            auth = await proto.discover(self._http, url)
        except OAuthFailure as exc:
            raise self._as_error(exc, "discovering the server's authorization server") from None
        scopes = list(request.scopes) if request.scopes is not None else list(auth.scopes_supported)
        if request.max_scopes is not None and request.grant != "clientCredentials":
            raise InvalidRequest(
                "Field 'maxScopes' is invalid: it bounds the step-up of a clientCredentials "
                "connection; an end user consents to each larger scope instead.",
                details={"field": "maxScopes"},
            )
        if request.grant == "clientCredentials":
            return await self._client_credentials(request, target, auth, scopes)
        if self.callback_url is None:
            raise Unavailable(
                "OAuth connections need TOOLBUS_OAUTH_CALLBACK_URL (the public URL of this service's "
                "/oauth/callback) to be set.",
                details={"setting": "TOOLBUS_OAUTH_CALLBACK_URL"},
            )
        if auth.offline_access and "offline_access" not in scopes:
            scopes.append("offline_access")
        client = await self._client(request, auth)
        connection_id = "conn_" + uuid.uuid4().hex
        url_out, expires = await self._new_link(connection_id, target, request.server, auth, client, scopes)
        log.info(
            "oauth connection started",
            extra={"connectionId": connection_id, "credentialsLevel": target.level, "server": request.server},
        )
        return CredentialsConnectReply(
            connection_id=connection_id,
            level=target.level,
            status="pending",
            authorization_url=url_out,
            expires_at=_iso(expires),
        )

    async def _new_link(
        self,
        connection_id: str,
        target: Target,
        server: str,
        auth: ServerAuth,
        client: ClientInfo,
        scopes: list[str],
    ) -> tuple[str, float]:
        """A toolbus URL (`/oauth/start/<token>`) for the end user: the `state` and the PKCE
        verifier are made only when it is opened, so neither is in any reply or event."""
        assert self.callback_url is not None
        token = proto.new_state()
        start = Start(
            connection_id=connection_id,
            target=target,
            server=server,
            auth=asdict(auth),
            client_id=client.client_id,
            client_secret=client.client_secret,
            scopes=scopes,
        )
        await self._put(self._keys.oauth_start(_digest(token)), start.model_dump_json(), self.link_ttl)
        base = self.callback_url.rsplit("/", 1)[0]
        return f"{base}/start/{token}", time.time() + self.link_ttl

    async def start(self, token: str) -> str | None:
        """`GET /oauth/start/<token>`: the authorization server's URL to redirect to (a new state
        and verifier), or None when the link is unknown, used or expired."""
        raw = await self._take(self._keys.oauth_start(_digest(token)))
        if raw is None:
            return None
        try:
            start = Start.model_validate_json(self._cipher.decrypt(raw))
        except (DecryptionError, ValueError):
            return None
        auth = ServerAuth(**start.auth)  # type: ignore[arg-type]
        url, _ = await self._new_flow(
            start.connection_id,
            start.target,
            start.server,
            auth,
            ClientInfo(start.client_id, start.client_secret),
            start.scopes,
        )
        return url

    async def _new_flow(
        self,
        connection_id: str,
        target: Target,
        server: str,
        auth: ServerAuth,
        client: ClientInfo,
        scopes: list[str],
    ) -> tuple[str, float]:
        assert self.callback_url is not None
        state, verifier = proto.new_state(), proto.new_verifier()
        flow = Flow(
            connection_id=connection_id,
            target=target,
            server=server,
            auth=asdict(auth),
            client_id=client.client_id,
            client_secret=client.client_secret,
            verifier=verifier,
            redirect_uri=self.callback_url,
            scopes=scopes,
        )
        await self._put(self._keys.oauth_flow(_digest(state)), flow.model_dump_json(), self.state_ttl)
        url = proto.authorization_url(
            auth, client, redirect_uri=self.callback_url, state=state, verifier=verifier, scopes=scopes
        )
        return url, time.time() + self.state_ttl

    @property
    def client_metadata_url(self) -> str | None:
        return client_metadata_url(self.callback_url)

    async def _client(self, request: CredentialsConnectRequest, auth: ServerAuth) -> ClientInfo:
        """The client to connect as, in the MCP spec's order: the one the caller registered,
        else toolbus's Client ID Metadata Document where the authorization server supports it,
        else dynamic registration (once per authorization server, cached encrypted)."""
        if request.client is not None:
            secret = request.client.client_secret
            return ClientInfo(request.client.client_id, None if secret is None else secret.get_secret_value())
        if auth.client_id_metadata_document_supported and self.client_metadata_url is not None:
            return ClientInfo(self.client_metadata_url)
        assert self.callback_url is not None
        key = self._keys.oauth_client(_digest(f"{auth.issuer}\0{self.callback_url}"))
        raw = await self._redis.get(key)
        if raw is not None:
            try:
                cached = ClientInfo(**json.loads(self._cipher.decrypt(raw)))
                return cached
            except (DecryptionError, TypeError, ValueError):
                pass
        try:
            client = await proto.register_client(
                self._http, auth, self.callback_url, self.client_name, confidential=False
            )
        except OAuthFailure as exc:
            raise self._as_error(exc, "registering toolbus as a client") from None
        await self._put(key, json.dumps(asdict(client)), None)
        return client

    async def _client_credentials(
        self, request: CredentialsConnectRequest, target: Target, auth: ServerAuth, scopes: list[str]
    ) -> CredentialsConnectReply:
        if target.level != "toolset":
            raise InvalidRequest(
                "Field 'grant' is invalid: clientCredentials connects a toolset (machine to machine), "
                "not an end user or a run.",
                details={"field": "grant"},
            )
        if request.client is None or request.client.client_secret is None:
            raise InvalidRequest(
                "Field 'client' is required for clientCredentials: the client id and secret registered "
                "with the authorization server.",
                details={"field": "client"},
            )
        client = ClientInfo(request.client.client_id, request.client.client_secret.get_secret_value())
        try:
            tokens = await proto.token_grant(
                self._http,
                auth,
                client,
                "client_credentials",
                scope=" ".join(scopes) or None,
                resource=auth.resource,
            )
        except OAuthFailure as exc:
            raise self._as_error(exc, "the client credentials grant") from None
        connection = Connection(
            connection_id="conn_" + uuid.uuid4().hex,
            target=target,
            server=request.server,
            grant="clientCredentials",
            auth=asdict(auth),
            client_id=client.client_id,
            client_secret=client.client_secret,
            scopes=tokens.scopes or scopes,
            requested_scopes=scopes,
            allowed_scopes=list(dict.fromkeys([*scopes, *(request.max_scopes or [])])),
            access_token=tokens.access_token,
            refresh_token=None,
            expires_at=tokens.expires_at,
            connected_at=time.time(),
        )
        await self._store(connection)
        await self._patch(target, request.server, _bearer(connection))
        await self._outbox.connected(CredentialsConnected(data=_event_data(connection)))
        return CredentialsConnectReply(
            connection_id=connection.connection_id, level=target.level, status="connected"
        )

    @staticmethod
    def _as_error(exc: OAuthFailure, step: str) -> Exception:
        if exc.permanent:
            return InvalidRequest(f"OAuth failed while {step}: {exc}.", details={"error": exc.error})
        return Unavailable(f"OAuth failed while {step}: {exc}.", details={"error": exc.error})

    # ---- the callback ------------------------------------------------------------------------

    async def callback(self, params: dict[str, str]) -> tuple[bool, str]:
        """Handle the authorization server's redirect; returns (connected, text for the user's
        page). Never raises for what the request holds; nothing is stored unless connected."""
        state = params.get("state")
        if not state:
            await self._failed(None, None, None, "unknownState", "the callback came with no state")
            return False, "This link is not a valid authorization response (it has no state)."
        raw = await self._take(self._keys.oauth_flow(_digest(state)))
        flow: Flow | None = None
        if raw is not None:
            try:
                flow = Flow.model_validate_json(self._cipher.decrypt(raw))
            except (DecryptionError, ValueError):
                flow = None
        if flow is None:
            await self._failed(None, None, None, "unknownState", "the state is unknown, used or expired")
            return False, (
                "This authorization link was already used or has expired. Ask for a new one and "
                "connect again."
            )
        auth = ServerAuth(**flow.auth)  # type: ignore[arg-type]
        if "error" in params:
            error = params["error"] if params["error"].replace("_", "").isalpha() else "error"
            await self._failed(
                flow.connection_id, flow.target, flow.server, error, "the authorization was refused"
            )
            if error == "access_denied":
                return False, "You declined access. Nothing was connected; you may close this page."
            return False, f"The authorization server refused the request ({error}). Nothing was connected."
        issuer = params.get("iss")
        if (issuer is not None or auth.iss_parameter_supported) and issuer != auth.issuer:
            # RFC 9207: a response from another issuer than the one this state was sent to (mix-up).
            await self._failed(
                flow.connection_id,
                flow.target,
                flow.server,
                "issuerMismatch",
                "the response's iss is not the authorization server the request went to",
            )
            return (
                False,
                "The response did not come from the expected authorization server. Nothing was connected.",
            )
        code = params.get("code")
        if not code:
            await self._failed(flow.connection_id, flow.target, flow.server, "invalidResponse", "no code")
            return False, "The authorization response had no code. Nothing was connected."
        client = ClientInfo(flow.client_id, flow.client_secret)
        try:
            tokens = await proto.token_grant(
                self._http,
                auth,
                client,
                "authorization_code",
                code=code,
                redirect_uri=flow.redirect_uri,
                code_verifier=flow.verifier,
                resource=auth.resource,
            )
        except OAuthFailure as exc:
            error = "providerUnavailable" if not exc.permanent else "exchangeFailed"
            await self._failed(flow.connection_id, flow.target, flow.server, error, str(exc))
            return (
                False,
                "The authorization server did not give toolbus a token. Nothing was connected; try again.",
            )
        now = time.time()
        connection = Connection(
            connection_id=flow.connection_id,
            target=flow.target,
            server=flow.server,
            grant="authorizationCode",
            auth=flow.auth,
            client_id=flow.client_id,
            client_secret=flow.client_secret,
            scopes=tokens.scopes or flow.scopes,
            requested_scopes=flow.scopes,
            access_token=tokens.access_token,
            refresh_token=tokens.refresh_token,
            expires_at=tokens.expires_at,
            connected_at=now,
        )
        await self._store(connection)
        await self._redis.delete(self._keys.oauth_step_up(flow.target.level, flow.target.scope, flow.server))
        await self._patch(flow.target, flow.server, _bearer(connection))
        CONNECTS.labels("connected").inc()
        await self._outbox.connected(CredentialsConnected(data=_event_data(connection)))
        log.info(
            "oauth connection made",
            extra={
                "connectionId": flow.connection_id,
                "credentialsLevel": flow.target.level,
                "server": flow.server,
            },
        )
        return True, "Connected. You may close this page."

    async def _failed(
        self, connection_id: str | None, target: Target | None, server: str | None, error: str, message: str
    ) -> None:
        CONNECTS.labels(
            error if error in ("access_denied", "unknownState", "issuerMismatch") else "failed"
        ).inc()
        log.warning("oauth connection failed", extra={"connectionId": connection_id, "error": error})
        await self._outbox.failed(
            CredentialsConnectFailed(
                data=CredentialsConnectionData(
                    connection_id=connection_id,
                    level=target.level if target else None,
                    toolset_id=target.toolset_id if target else None,
                    namespace=target.namespace if target else None,
                    run_id=target.run_id if target else None,
                    server=server,
                    error=error,
                    message=message,
                )
            )
        )

    # ---- storage -----------------------------------------------------------------------------

    async def _put(self, key: str, plaintext: str, ttl: float | None) -> None:
        """Store an encrypted record (for `ttl` seconds, else for good), indexed for the
        secret key's rotation (`CredentialStore.rotate`)."""
        ttl_ms = None if ttl is None else int(ttl * 1000)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(key, self._cipher.encrypt(plaintext.encode()), px=ttl_ms)
            index_encrypted(pipe, self._keys, key, ttl_ms=ttl_ms)
            await pipe.execute()

    async def _take(self, key: str) -> bytes | None:
        """Get and delete a single-use record (a pending flow or link)."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.getdel(key)
            unindex_encrypted(pipe, self._keys, key)
            raw, *_ = await pipe.execute()
        return raw  # type: ignore[no-any-return]

    async def _store(self, connection: Connection) -> None:
        key = self._keys.oauth_connection(connection.target.level, connection.target.scope, connection.server)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(key, self._cipher.encrypt(connection.model_dump_json().encode()))
            index_encrypted(pipe, self._keys, key)
            pipe.sadd(
                self._keys.oauth_servers(connection.target.level, connection.target.scope), connection.server
            )
            member = _member(connection.target, connection.server)
            if connection.status == "connected" and connection.expires_at is not None:
                pipe.zadd(self._keys.oauth_due, {member: int(self._due(connection.expires_at) * 1000)})
            else:
                pipe.zrem(self._keys.oauth_due, member)
            await pipe.execute()

    def _due(self, expires_at: float) -> float:
        """When to renew: `refresh_margin` before expiry, up to 20% of it earlier (jitter, so that
        tokens issued together are not renewed together), never before half the token's life."""
        margin = self.refresh_margin * (1 + 0.2 * random.random())
        return max(expires_at - margin, time.time() + max(0.0, (expires_at - time.time()) / 2))

    async def load(self, target: Target, server: str) -> Connection | None:
        raw = await self._redis.get(self._keys.oauth_connection(target.level, target.scope, server))
        if raw is None:
            return None
        try:
            return Connection.model_validate_json(self._cipher.decrypt(raw))
        except DecryptionError:
            log.error("stored OAuth connection cannot be decrypted", extra={"server": server})
            return None

    async def servers(self, target: Target) -> list[str]:
        return sorted(
            m.decode()
            for m in await self._redis.smembers(self._keys.oauth_servers(target.level, target.scope))
        )

    async def forget(self, target: Target, server: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            key = self._keys.oauth_connection(target.level, target.scope, server)
            pipe.delete(key)
            unindex_encrypted(pipe, self._keys, key)
            pipe.delete(self._keys.oauth_step_up(target.level, target.scope, server))
            pipe.srem(self._keys.oauth_servers(target.level, target.scope), server)
            pipe.zrem(self._keys.oauth_due, _member(target, server))
            await pipe.execute()

    # ---- renewal -----------------------------------------------------------------------------

    async def refresh_due(self, now: float | None = None) -> int:
        """Renew every token now due (one replica per token: a lock, and a re-read after it);
        returns how many this replica renewed."""
        now_ms = int((now if now is not None else time.time()) * 1000)
        due = await self._redis.zrangebyscore(self._keys.oauth_due, "-inf", now_ms, start=0, num=100)
        done = 0
        for raw in due:
            level, scope, server = raw.decode().split("\0")
            target = await self._target_of(level, scope)
            if target is None:
                await self._redis.zrem(self._keys.oauth_due, raw)
                continue
            if await self.renew(target, server, reason="due"):
                done += 1
        return done

    async def _target_of(self, level: str, scope: str) -> Target | None:
        if level == "toolset":
            return Target(level="toolset", toolset_id=scope, namespace=None, run_id=None)
        if level == "namespace":
            toolset_id, _, namespace = scope.partition(":")
            return Target(level="namespace", toolset_id=toolset_id, namespace=namespace, run_id=None)
        return await self._run_target(scope)

    async def renew(
        self,
        target: Target,
        server: str,
        *,
        reason: Literal["due", "rejected"],
        step_up: list[str] | None = None,
    ) -> bool:
        """Renew one connection's access token under its lock; True when this call renewed it.
        A permanent failure marks the connection expired (calls then park and the notice carries
        a new authorization URL). `step_up`: scopes a client-credentials token is to have too."""
        lock = self._keys.oauth_lock(target.level, target.scope, server)
        if not await self._redis.set(lock, self._holder, nx=True, px=30_000):
            return False
        try:
            connection = await self.load(target, server)
            if connection is None or connection.status != "connected":
                await self._redis.zrem(self._keys.oauth_due, _member(target, server))
                return False
            if reason == "due":
                score = await self._redis.zscore(self._keys.oauth_due, _member(target, server))
                if score is not None and score > time.time() * 1000:
                    return False  # another replica renewed it meanwhile
            elif connection.renewed_on_reject:
                return False  # the token of the last such renewal was refused too: park
            auth = connection.server_auth()
            try:
                if connection.grant == "clientCredentials":
                    if step_up:
                        wanted = list(dict.fromkeys([*connection.requested_scopes, *step_up]))
                        connection = connection.model_copy(update={"requested_scopes": wanted})
                    tokens = await proto.token_grant(
                        self._http,
                        auth,
                        connection.client(),
                        "client_credentials",
                        scope=" ".join(connection.requested_scopes) or None,
                        resource=auth.resource,
                    )
                elif connection.refresh_token is None:
                    raise OAuthFailure("no refresh token was issued", error="noRefreshToken", permanent=True)
                else:
                    self.refreshes += 1
                    tokens = await proto.token_grant(
                        self._http,
                        auth,
                        connection.client(),
                        "refresh_token",
                        refresh_token=connection.refresh_token,
                        resource=auth.resource,
                    )
            except OAuthFailure as exc:
                REFRESHES.labels(reason, "permanent" if exc.permanent else "retry").inc()
                if not exc.permanent:
                    log.warning(
                        "oauth refresh failed; will retry", extra={"server": server, "error": exc.error}
                    )
                    await self._redis.zadd(
                        self._keys.oauth_due, {_member(target, server): int((time.time() + 5) * 1000)}
                    )
                    return False
                log.warning(
                    "oauth refresh failed for good: the connection is expired",
                    extra={"server": server, "credentialsLevel": target.level, "error": exc.error},
                )
                await self._store(connection.model_copy(update={"status": "expired"}))
                return False
            REFRESHES.labels(reason, "ok").inc()
            renewed = _renewed(connection, tokens, reason == "rejected")
            await self._store(renewed)
            await self._patch(target, server, _bearer(renewed))
            return True
        finally:
            await self._unlock(keys=[lock], args=[self._holder])

    async def on_rejected(self, parked: CallParked) -> bool:
        """A call met a 401/403 with this level's headers: renew once if the server is connected
        there; True when a new token was stored (the caller resumes the call instead of parking)."""
        target = Target(
            level=parked.level,
            toolset_id=parked.toolset_id,
            namespace=parked.namespace if parked.level != "toolset" else None,
            run_id=parked.run_id if parked.level == "run" else None,
        )
        if not await self._redis.sismember(
            self._keys.oauth_servers(target.level, target.scope), parked.server
        ):
            return False
        if parked.required_scopes is None:
            return await self.renew(target, parked.server, reason="rejected")
        return await self._step_up(target, parked.server, parked.required_scopes)

    async def _step_up(self, target: Target, server: str, asked: list[str]) -> bool:
        """A 403 `insufficient_scope` (MCP authorization spec, scope challenge handling). A
        client-credentials connection gets a token with the named scopes at once (True: resume)
        only when the operator allowed them at connect (none named: all it allowed); otherwise the
        call parks for a person to connect again. An end user must consent to the larger scope, so
        the call parks and the notice's link asks for it (RFC 6749 section 6), up to
        STEP_UP_MAX scopes in all."""
        connection = await self.load(target, server)
        if connection is None or connection.status != "connected":
            return False
        if connection.grant == "clientCredentials":
            allowed = connection.allowed_scopes
            if allowed is None:
                allowed = connection.requested_scopes
            wanted = list(asked) or list(allowed)
            outside = [s for s in wanted if s not in allowed]
            if outside:
                log.warning(
                    "oauth step-up refused: the server asks for scopes the connection does not allow",
                    extra={"server": server, "credentialsLevel": target.level, "scopes": outside},
                )
                return False
            return await self.renew(target, server, reason="rejected", step_up=wanted)
        wanted = list(asked) or connection.server_auth().scopes_supported
        key = self._keys.oauth_step_up(target.level, target.scope, server)
        have = {m.decode() for m in await self._redis.smembers(key)}
        new = [s for s in dict.fromkeys(wanted) if s not in have]
        if len(have) + len(new) > STEP_UP_MAX:
            log.warning(
                "oauth step-up not recorded: it would ask for more scopes than allowed",
                extra={"server": server, "credentialsLevel": target.level, "limit": STEP_UP_MAX},
            )
            return False
        if new:
            await self._redis.sadd(key, *new)
        log.info(
            "oauth step-up: the server asks for a larger scope",
            extra={"server": server, "credentialsLevel": target.level, "scopes": wanted},
        )
        return False

    async def reconnect_url(self, target: Target, server: str) -> tuple[str, str] | None:
        """For a notice: a new authorization URL for a connected server, asking for the scopes
        asked before plus those of any step-up since, or None."""
        connection = await self.load(target, server)
        if connection is None or connection.grant != "authorizationCode" or self.callback_url is None:
            return None
        auth = connection.server_auth()
        more = await self._redis.smembers(self._keys.oauth_step_up(target.level, target.scope, server))
        scopes = list(
            dict.fromkeys(
                [*connection.requested_scopes, *connection.scopes, *sorted(m.decode() for m in more)]
            )
        )
        url, _ = await self._new_link(
            connection.connection_id, target, server, auth, connection.client(), scopes
        )
        return url, connection.connection_id

    # ---- status and disconnect ---------------------------------------------------------------

    async def status(self, request: CredentialsTarget) -> CredentialsStatusReply:
        target = await self.target(request)
        out: list[OAuthConnectionStatus] = []
        for server in await self.servers(target):
            c = await self.load(target, server)
            if c is None:
                continue
            out.append(
                OAuthConnectionStatus(
                    server=server,
                    status=c.status,
                    grant=c.grant,
                    scopes=c.scopes,
                    expires_at=_iso(c.expires_at),
                    connected_at=_iso(c.connected_at) or "",
                    last_refresh_at=_iso(c.last_refresh_at),
                    issuer=c.server_auth().issuer,
                )
            )
        return CredentialsStatusReply(level=target.level, connections=out)

    async def disconnect(self, request: CredentialsDisconnectRequest) -> CredentialsDisconnectReply:
        target = await self.target(request)
        connection = await self.load(target, request.server)
        if connection is None:
            return CredentialsDisconnectReply(
                level=target.level, server=request.server, disconnected=False, revoked=False
            )
        token, hint = (
            (connection.refresh_token, "refresh_token")
            if connection.refresh_token
            else (connection.access_token, "access_token")
        )
        revoked = await proto.revoke(
            self._http, connection.server_auth(), connection.client(), token=token, hint=hint
        )
        await self.forget(target, request.server)
        await self._patch(target, request.server, None)
        log.info("oauth connection removed", extra={"server": request.server, "revoked": revoked})
        return CredentialsDisconnectReply(
            level=target.level, server=request.server, disconnected=True, revoked=revoked
        )


def _renewed(connection: Connection, tokens: Tokens, on_reject: bool) -> Connection:
    return connection.model_copy(
        update={
            "access_token": tokens.access_token,
            # Rotation: keep the new refresh token; a server that does not rotate sends none.
            "refresh_token": tokens.refresh_token or connection.refresh_token,
            "expires_at": tokens.expires_at,
            "scopes": tokens.scopes or connection.scopes,
            "last_refresh_at": time.time(),
            "renewed_on_reject": on_reject,
        }
    )


def _bearer(connection: Connection) -> dict[str, str]:
    return {"Authorization": f"Bearer {connection.access_token}"}


def _event_data(connection: Connection) -> CredentialsConnectionData:
    t = connection.target
    return CredentialsConnectionData(
        connection_id=connection.connection_id,
        level=t.level,
        toolset_id=t.toolset_id,
        namespace=t.namespace,
        run_id=t.run_id,
        server=connection.server,
        scopes=connection.scopes,
        expires_at=_iso(connection.expires_at),
    )
