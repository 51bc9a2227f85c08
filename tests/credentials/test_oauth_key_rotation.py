"""OAuth records follow `TOOLBUS_SECRET_KEY`'s rotation: a real authorization server
(oidc-provider, 4-second access tokens, refresh-token rotation), an MCP server that accepts only
its tokens, the registry, the credentials service and the dispatcher as processes.

Under the old key: an end user connected, a client registered dynamically, a connect link not yet
opened and a flow whose user consented but whose redirect has not landed yet. Then the key is
rotated as an operator does it (services on `new,old`, `CredentialStore.rotate()`, services on
`new` only) and: every encrypted value under the deployment's prefix opens with the new key and
none with the old; the connection is refreshed and calls use it; the pending flow and the link,
encrypted under the old key, complete.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx
import nats
import pytest
from cryptography.fernet import Fernet
from redis.asyncio import Redis
from toolbus_common.credential_store import CredentialStore
from toolbus_common.keys import Keys
from toolbus_common.secrets import Cipher, DecryptionError
from toolbus_contracts import Subjects
from toolbus_devstack.processes import free_port

from tests.support.infra import aservice_process, drop_deployment_state, request_ok, unique_prefix
from tests.support.mcp_servers import McpTestServer
from tests.support.oauth import OidcProvider, consent, provider_available, resource_guard

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not provider_available(), reason="oidc-provider not installed (make npm-tools)"),
]

TTL = 4
M2M_ID = "toolbus-m2m"
M2M_SECRET = "m2m-" + secrets.token_hex(16)


async def _land(callback_url: str) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.get(callback_url)
    assert response.status_code == 200 and "Connected" in response.text, response.text


async def _encrypted_values(redis: Redis[bytes], prefix: str) -> dict[str, bytes]:
    """Every Fernet ciphertext stored under `prefix` (string values and hash fields)."""
    found: dict[str, bytes] = {}
    async for raw in redis.scan_iter(match=f"{prefix}:*", count=500):
        key = raw.decode()
        kind = (await redis.type(key)).decode()  # type: ignore[no-untyped-call]
        values: list[bytes] = []
        if kind == "string":
            values = [await redis.get(key) or b""]
        elif kind == "hash":
            values = list((await redis.hgetall(key)).values())
        for i, value in enumerate(values):
            if value.startswith(b"gAAAAA"):
                found[f"{key}#{i}"] = value
    return found


def _opens(cipher: Cipher, value: bytes) -> bool:
    try:
        cipher.decrypt(value)
    except DecryptionError:
        return False
    return True


def bearer(token: str) -> dict[str, Any]:
    return {"credentials": {"servers": {"gh": {"headers": {"Authorization": f"Bearer {token}"}}}}}


async def _m2m_token(provider: OidcProvider, resource: str) -> str:
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{provider.issuer}/token",
            data={"grant_type": "client_credentials", "resource": resource, "scope": "tools:read"},
            auth=(M2M_ID, M2M_SECRET),
        )
    response.raise_for_status()
    token: str = response.json()["access_token"]
    return token


async def test_oauth_records_are_re_encrypted_when_the_secret_key_rotates(
    service_env: dict[str, str], nats_url: str, redis_url: str
) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    prefix = unique_prefix("tbkr")
    subjects = Subjects(prefix)
    port = free_port()
    callback = f"http://127.0.0.1:{port}/oauth/callback"
    env = {
        **service_env,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_REDIS_PREFIX": prefix,
        "TOOLBUS_OAUTH_CALLBACK_URL": callback,
        "TOOLBUS_OAUTH_REFRESH_MARGIN": "1500ms",
        "TOOLBUS_OAUTH_REFRESH_INTERVAL": "100ms",
        "TOOLBUS_PARK_NOTIFY_DELAY": "100ms",
    }
    m2m = {
        "client_id": M2M_ID,
        "client_secret": M2M_SECRET,
        "grant_types": ["client_credentials"],
        "redirect_uris": [],
        "response_types": [],
    }
    nc = await nats.connect(nats_url)
    redis: Redis[bytes] = Redis.from_url(redis_url)

    @asynccontextmanager
    async def services(key: str, credentials_key: str | None = None) -> AsyncIterator[None]:
        """The services on `key` (the credentials service on `credentials_key`: a rolling
        restart half done)."""
        keyed = {**env, "TOOLBUS_SECRET_KEY": key}
        async with (
            aservice_process("registry", keyed),
            aservice_process(
                "credentials", {**keyed, "TOOLBUS_SECRET_KEY": credentials_key or key}, port=port
            ),
            aservice_process("dispatcher", keyed),
        ):
            yield

    async def parked_then_resumed(key: str) -> None:
        """A call that meets a 401 with the toolset's header is parked (CallParked, dispatcher to
        credentials) and resumed by a set (CallsResume, credentials to dispatcher): the services'
        signed commands get through."""
        await request_ok(
            nc, subjects.toolsets_credentials_set, {"toolsetId": toolset_id, **bearer("expired")}
        )
        run = await request_ok(nc, subjects.runs_open, {"toolsetId": toolset_id, "namespace": "user-none"})
        body = {"runId": run["runId"], "tool": "gh.echo", "input": {"text": key}, "idempotencyKey": key}
        started = await request_ok(nc, subjects.calls_start, body)
        for _ in range(200):
            if (await request_ok(nc, subjects.calls_get, {"callId": started["callId"]}))["state"] == "parked":
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # the credentials service has the park (or a set resumes nothing)
        fresh = await _m2m_token(provider, server.url)
        await request_ok(nc, subjects.toolsets_credentials_set, {"toolsetId": toolset_id, **bearer(fresh)})
        done = await request_ok(nc, subjects.calls_invoke, body, timeout=30)
        assert done["callId"] == started["callId"] and done["outcome"]["status"] == "ok"
        await request_ok(nc, subjects.runs_close, {"runId": run["runId"]})

    async def call(namespace: str) -> str:
        run = await request_ok(nc, subjects.runs_open, {"toolsetId": toolset_id, "namespace": namespace})
        done = await request_ok(
            nc,
            subjects.calls_invoke,
            {"runId": run["runId"], "tool": "gh.echo", "input": {"text": "hi"}},
            timeout=60,
        )
        await request_ok(nc, subjects.runs_close, {"runId": run["runId"]})
        status: str = done["outcome"]["status"]
        return status

    try:
        async with AsyncExitStack() as exits:
            provider = await exits.enter_async_context(OidcProvider(access_ttl=TTL, clients=[m2m]))
            server = McpTestServer(name="gh")
            server.guard = resource_guard(provider.issuer, lambda: server.url)
            await exits.enter_async_context(server)

            async with services(old):
                token = await _m2m_token(provider, server.url)
                toolset = await request_ok(
                    nc,
                    subjects.toolsets_create,
                    {
                        "mcp": [{"name": "gh", "url": server.url}],
                        "credentials": {"servers": {"gh": {"headers": {"Authorization": f"Bearer {token}"}}}},
                    },
                    timeout=60,
                )
                toolset_id = toolset["id"]
                target = {"toolsetId": toolset_id, "server": "gh"}
                reply = await request_ok(nc, subjects.credentials_connect, {**target, "namespace": "user-r"})
                await _land(await consent(reply["authorizationUrl"], login="user-r"))
                assert await call("user-r") == "ok"
                # Pending under the old key: a link not opened, a flow whose redirect has not landed.
                link = (
                    await request_ok(nc, subjects.credentials_connect, {**target, "namespace": "user-p"})
                )["authorizationUrl"]
                reply = await request_ok(nc, subjects.credentials_connect, {**target, "namespace": "user-q"})
                landing = await consent(reply["authorizationUrl"], login="user-q")

            # A rolling restart onto `new,old`: the dispatcher first, the credentials service after.
            async with services(f"{new},{old}", credentials_key=old):
                await parked_then_resumed("k-rolling-1")

            before = await _encrypted_values(redis, prefix)
            kinds = {k.split(":")[1] + ":" + k.split(":")[2] for k in before}
            assert {"cred:namespace", "oauth:conn", "oauth:client", "oauth:start", "oauth:flow"} <= kinds, (
                kinds
            )
            old_cipher, new_cipher = Cipher(old), Cipher(new)
            assert all(old_cipher.decrypt(v) for v in before.values())

            async with services(f"{new},{old}"):
                assert await call("user-r") == "ok"
                rotated = await CredentialStore(redis, Keys(prefix), Cipher(f"{new},{old}")).rotate()
                assert rotated > 0  # (the service rewrote some itself meanwhile: a refresh)

            # The old key dropped: the dispatcher first again.
            async with services(new, credentials_key=f"{new},{old}"):
                await parked_then_resumed("k-rolling-2")

            after = await _encrypted_values(redis, prefix)
            assert set(after) >= set(before)
            assert [w for w, v in after.items() if not _opens(new_cipher, v)] == []
            assert [w for w, v in after.items() if _opens(old_cipher, v)] == []

            async with services(new):
                # The flow and the link stored under the old key complete under the new one.
                await _land(landing)
                assert await call("user-q") == "ok"
                await _land(await consent(link, login="user-p"))
                assert await call("user-p") == "ok"
                # The connection made under the old key is refreshed and used.
                refreshed = (await provider.stats()).get("refresh_token:ok", 0)
                await asyncio.sleep(TTL + 1)  # every token issued before this point has expired
                assert (await provider.stats()).get("refresh_token:ok", 0) > refreshed
                assert await call("user-r") == "ok"
                status = await request_ok(
                    nc, subjects.credentials_status, {"toolsetId": toolset_id, "namespace": "user-r"}
                )
                assert status["connections"][0]["status"] == "connected"
    finally:
        await drop_deployment_state(nc, redis_url, prefix)
        await redis.aclose()  # type: ignore[attr-defined]
        await nc.drain()
