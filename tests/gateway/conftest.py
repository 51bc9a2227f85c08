"""The gateway's tests: the registry, dispatcher, approval and credentials services as processes
under a prefix of their own (real NATS and Redis), the gateway in this process (its MCP port
picked by the OS), real MCP servers behind it, and the `mcp` package's own client in front."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
import pytest_asyncio
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from toolbus_common.settings import Settings
from toolbus_gateway.app import GatewayApp
from toolbus_gateway.settings import GatewaySettings

from tests.support.infra import (
    aservice_process,
    drop_deployment_state,
    js_name,
    request_ok,
    unique_prefix,
)
from tests.support.mcp_servers import Fault, McpTestServer, echo_handler, echo_tools, synthetic_tools

SERVICES = ("registry", "dispatcher", "approval", "credentials")
ISSUER = "https://idp.test.example"
AUDIENCE = "toolbus-gateway-tests"


class Jwks:
    """A test identity provider's signing key, its JWKS served over HTTP on a free port."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = json.loads(RSAAlgorithm.to_jwk(self.key.public_key()))
        body = json.dumps({"keys": [{**jwk, "kid": "test-key", "use": "sig", "alg": "RS256"}]}).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks.json"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def token(self, claims: dict[str, Any], key: Any = None) -> str:
        return jwt.encode(claims, key or self.key, algorithm="RS256", headers={"kid": "test-key"})


@dataclass
class Deployment:
    env: dict[str, str]
    nc: Any
    prefix: str
    gateway: GatewayApp
    jwks: Jwks

    @property
    def subjects(self) -> Any:
        return self.gateway.settings.subjects

    async def ok(self, subject: str, body: dict[str, Any], within: float = 30.0) -> dict[str, Any]:
        return await request_ok(self.nc, subject, body, within)

    async def token(self, toolsets: list[str], namespace: str = "user-42", ttl: str | None = None) -> str:
        body: dict[str, Any] = {"namespace": namespace, "toolsets": toolsets}
        if ttl is not None:
            body["ttl"] = ttl
        token: str = (await self.ok(self.subjects.tokens_create, body))["token"]
        return token

    def url(self, toolset_id: str, query: str = "") -> str:
        return f"{self.gateway.url}/mcp/{toolset_id}{query}"


@contextlib.asynccontextmanager
async def mcp_client(
    url: str,
    token: str | None,
    *,
    mode: str = "auto",
    headers: dict[str, str] | None = None,
    elicitation: Any = None,
) -> AsyncIterator[Client]:
    """The `mcp` package's client on `url` with a bearer token (mode `auto`: 2026-07-28;
    `legacy`: 2025-11-25 with a session)."""
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(create_mcp_http_client(headers=sent))
        client = await stack.enter_async_context(
            Client(streamable_http_client(url, http_client=http), mode=mode, elicitation_callback=elicitation)
        )
        yield client


@pytest.fixture(scope="package")
def jwks() -> Iterator[Jwks]:
    provider = Jwks()
    yield provider
    provider.server.shutdown()
    provider.server.server_close()


@pytest_asyncio.fixture(scope="package", loop_scope="session")
async def mcp_servers() -> AsyncIterator[dict[str, McpTestServer]]:
    servers = {
        "shop": McpTestServer(name="shop", tools=echo_tools(), handler=echo_handler),
        "many": McpTestServer(name="many", tools=synthetic_tools(12)),
        "locked": McpTestServer(
            name="locked", tools=echo_tools(), handler=echo_handler, required_token="good"
        ),
    }
    async with AsyncExitStack() as stack:
        for server in servers.values():
            await stack.enter_async_context(server)
        yield servers


@pytest_asyncio.fixture(scope="package", loop_scope="session")
async def deployment(
    service_env: dict[str, str], nc: Any, redis_url: str, jwks: Jwks
) -> AsyncIterator[Deployment]:
    prefix = unique_prefix("tbgw")
    env = {
        **service_env,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_REDIS_PREFIX": prefix,
        "TOOLBUS_PARK_NOTIFY_DELAY": "100ms",
        "TOOLBUS_LOG_LEVEL": "WARNING",
    }
    settings = Settings(
        nats_url=env["TOOLBUS_NATS_URL"],
        redis_url=env["TOOLBUS_REDIS_URL"],
        subject_prefix=prefix,
        redis_prefix=prefix,
    )
    gateway_settings = GatewaySettings(
        port=0,
        page_size=5,
        large_toolset=50,
        watch_interval_seconds=0.2,
        max_body_bytes=64 * 1024,
        reconnect_url="https://app.example/connect?user={namespace}&server={server}",
        jwt_jwks_url=jwks.url,
        jwt_issuer=ISSUER,
        jwt_audience=AUDIENCE,
    )
    try:
        async with AsyncExitStack() as services:
            for name in SERVICES:
                await services.enter_async_context(aservice_process(name, env))
            app = GatewayApp(settings, gateway_settings)
            await app.start()
            try:
                yield Deployment(env, nc, prefix, app, jwks)
            finally:
                await app.stop()
    finally:
        await drop_deployment_state(nc, redis_url, prefix)
        with contextlib.suppress(Exception):
            await nc.jetstream().delete_stream(f"OBJ_{js_name(prefix, 'outputs')}")


@pytest_asyncio.fixture(scope="package", loop_scope="session")
async def toolset(deployment: Deployment, mcp_servers: dict[str, McpTestServer]) -> str:
    """`shop` (echo/plain/fail; `fail` approval-free), `gated` (echo under approval, `plain`
    at-most-once), `many` (12 tools, paged 5 at a time)."""
    spec = {
        "mcp": [
            {"name": "shop", "url": mcp_servers["shop"].url},
            {
                "name": "gated",
                "url": mcp_servers["shop"].url,
                "policies": {"echo": {"approval": True}, "plain": {"onInterruption": "at_most_once"}},
            },
            {"name": "many", "url": mcp_servers["many"].url},
        ]
    }
    toolset_id: str = (await deployment.ok(deployment.subjects.toolsets_create, spec, within=60))["id"]
    return toolset_id


__all__ = ["AUDIENCE", "ISSUER", "Deployment", "Fault", "mcp_client"]
