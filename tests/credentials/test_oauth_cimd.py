"""Client ID Metadata Documents (MCP authorization spec 2025-11-25,
draft-ietf-oauth-client-id-metadata-document) against a real authorization server: oidc-provider,
whose metadata says `client_id_metadata_document_supported`, fetches toolbus's document from the
running credentials service (over HTTPS: a TLS front as a deployment has, its certificate trusted
by the provider) and validates it itself. The registry, the credentials service and the dispatcher
run as processes.

Proves: with no client of the caller's, toolbus's `client_id` is the URL of its document (no
dynamic registration made); the document holds what the draft asks; an end user connects, calls
use the token (issued to that client id) and it is refreshed; a client the caller registered wins
over the document (the MCP spec's order).
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import httpx
import jwt
import nats
import pytest
from redis.asyncio import Redis
from toolbus_contracts import Subjects
from toolbus_devstack.processes import free_port

from tests.support.infra import aservice_process, drop_deployment_state, request_ok, unique_prefix
from tests.support.mcp_servers import McpTestServer
from tests.support.oauth import OidcProvider, consent, provider_available, query, resource_guard
from tests.support.tls_front import TlsFront

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not provider_available(), reason="oidc-provider not installed (make npm-tools)"),
]

TTL = 4
M2M_ID = "toolbus-m2m"
M2M_SECRET = "m2m-" + secrets.token_hex(16)
OWN_CLIENT = "registered-by-hand"


async def test_toolbus_is_known_to_the_authorization_server_by_its_client_id_metadata_document(
    service_env: dict[str, str], nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    prefix = unique_prefix("tbcm")
    subjects = Subjects(prefix)
    port = free_port()
    nc = await nats.connect(nats_url)
    redis: Redis[bytes] = Redis.from_url(redis_url)
    try:
        async with TlsFront(port, tmp_path) as front:
            public = f"{front.url}/oauth"
            m2m = {
                "client_id": M2M_ID,
                "client_secret": M2M_SECRET,
                "grant_types": ["client_credentials"],
                "redirect_uris": [],
                "response_types": [],
            }
            own = {
                "client_id": OWN_CLIENT,
                "token_endpoint_auth_method": "none",
                "grant_types": ["authorization_code", "refresh_token"],
                "redirect_uris": [f"{public}/callback"],
            }
            env = {
                **service_env,
                "TOOLBUS_SUBJECT_PREFIX": prefix,
                "TOOLBUS_REDIS_PREFIX": prefix,
                "TOOLBUS_OAUTH_CALLBACK_URL": f"{public}/callback",
                "TOOLBUS_OAUTH_REFRESH_MARGIN": "1500ms",
                "TOOLBUS_OAUTH_REFRESH_INTERVAL": "100ms",
            }
            async with (
                OidcProvider(access_ttl=TTL, clients=[m2m, own], ca_file=front.ca_file) as provider,
                McpTestServer(name="gh") as server,
            ):
                server.guard = resource_guard(provider.issuer, lambda: server.url)
                async with (
                    aservice_process("registry", env),
                    aservice_process("credentials", env, port=port),
                    aservice_process("dispatcher", env),
                ):
                    await _flow(nc, subjects, prefix, provider, server, front, redis)
    finally:
        await drop_deployment_state(nc, redis_url, prefix)
        await redis.aclose()  # type: ignore[attr-defined]
        await nc.drain()


async def _flow(
    nc: Any,
    subjects: Subjects,
    prefix: str,
    provider: OidcProvider,
    server: McpTestServer,
    front: TlsFront,
    redis: Redis[bytes],
) -> None:
    document_url = f"{front.url}/oauth/client-metadata.json"
    async with httpx.AsyncClient(verify=front.client()) as http:
        metadata = (await http.get(f"{provider.issuer}/.well-known/openid-configuration")).json()
        assert metadata["client_id_metadata_document_supported"] is True
        document = await http.get(document_url)
    assert document.status_code == 200 and document.json() == {
        "client_id": document_url,
        "client_name": "toolbus",
        "redirect_uris": [f"{front.url}/oauth/callback"],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    }

    async with httpx.AsyncClient() as http:
        registration = await http.post(
            f"{provider.issuer}/token",
            data={"grant_type": "client_credentials", "resource": server.url, "scope": "tools:read"},
            auth=(M2M_ID, M2M_SECRET),
        )
    token = registration.json()["access_token"]
    toolset = await request_ok(
        nc,
        subjects.toolsets_create,
        {
            "mcp": [{"name": "gh", "url": server.url}],
            "credentials": {"servers": {"gh": {"headers": {"Authorization": f"Bearer {token}"}}}},
        },
        timeout=60,
    )
    target = {"toolsetId": toolset["id"], "server": "gh", "namespace": "user-c"}

    fetched = (await provider.stats()).get("cimd:200", 0)
    reply = await request_ok(nc, subjects.credentials_connect, target)
    assert reply["authorizationUrl"].startswith(f"{front.url}/oauth/start/")
    landing = await consent(reply["authorizationUrl"], login="user-c", verify=front.client())
    assert query(landing)["state"]
    async with httpx.AsyncClient(verify=front.client()) as http:
        page = await http.get(landing)
    assert page.status_code == 200 and "Connected" in page.text, page.text
    # The provider fetched the document from the running service; toolbus registered nothing.
    assert (await provider.stats()).get("cimd:200", 0) > fetched
    assert [k async for k in redis.scan_iter(match=f"{prefix}:oauth:client:*")] == []

    async def call() -> str:
        run = await request_ok(nc, subjects.runs_open, {"toolsetId": toolset["id"], "namespace": "user-c"})
        done = await request_ok(
            nc, subjects.calls_invoke, {"runId": run["runId"], "tool": "gh.echo", "input": {"text": "c"}}, 60
        )
        await request_ok(nc, subjects.runs_close, {"runId": run["runId"]})
        status: str = done["outcome"]["status"]
        return status

    assert await call() == "ok"
    claims = jwt.decode(getattr(server.guard, "tokens", [""])[-1], options={"verify_signature": False})
    assert claims["client_id"] == document_url
    refreshed = (await provider.stats()).get("refresh_token:ok", 0)
    await asyncio.sleep(TTL + 1)
    assert (await provider.stats()).get("refresh_token:ok", 0) > refreshed
    assert await call() == "ok"

    # A client the caller registered comes first.
    reply = await request_ok(nc, subjects.credentials_connect, {**target, "client": {"clientId": OWN_CLIENT}})
    async with httpx.AsyncClient(verify=front.client()) as http:
        start = await http.get(reply["authorizationUrl"])
    assert start.status_code == 302 and query(start.headers["location"])["client_id"] == OWN_CLIENT
