"""The gateway as `python -m toolbus_gateway` on a secured NATS (deploy/nats/'s configuration,
one user per role and service): connected as its own user `gateway`, it serves `tokens.*` to the
`token-issuer` user, reads the pinned toolset and calls tools through the dispatcher, and the
server refuses none of it; no other client role may issue a token."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import nats
import orjson
import pytest
from toolbus_contracts import Subjects
from toolbus_nats_connect import NatsAuth

from tests.gateway.conftest import mcp_client
from tests.support.infra import aservice_process, drop_redis_keys, unique_prefix
from tests.support.mcp_servers import McpTestServer
from tests.system.security.conftest import SecuredNats, start_secured_nats

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SecuredNats, str]]:
    prefix = unique_prefix("tbgws")
    server = start_secured_nats(tmp_path_factory.mktemp("gw-secured"), prefixes=[prefix])
    try:
        yield server, prefix
    finally:
        server.server.stop()


async def _connect(server: SecuredNats, role: str, errors: list[str]) -> Any:
    async def on_error(exc: Exception) -> None:
        errors.append(f"{role}: {exc}")

    options = NatsAuth.from_env(server.env(role)).connect_options()
    return await nats.connect(**{**options, "error_cb": on_error, "connect_timeout": 10})


async def _request(nc: Any, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    reply: dict[str, Any] = orjson.loads((await nc.request(subject, orjson.dumps(body), timeout=30)).data)
    return reply


async def test_gateway_serves_as_its_own_nats_user(
    secured: tuple[SecuredNats, str], service_env: dict[str, str], redis_url: str
) -> None:
    server, prefix = secured
    subjects = Subjects(prefix)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **service_env,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_REDIS_PREFIX": prefix,
        "TOOLBUS_LOG_LEVEL": "WARNING",
    }
    errors: list[str] = []
    try:
        async with AsyncExitStack() as stack, McpTestServer(name="shop") as mcp:
            for name in ("registry", "dispatcher", "gateway"):
                extra = {"TOOLBUS_GATEWAY_PORT": str(port)} if name == "gateway" else {}
                await stack.enter_async_context(aservice_process(name, {**env, **server.env(name), **extra}))
            harness = await _connect(server, "harness", errors)
            issuer = await _connect(server, "token-issuer", errors)
            stack.push_async_callback(harness.drain)
            stack.push_async_callback(issuer.drain)
            created = await _request(
                harness, subjects.toolsets_create, {"mcp": [{"name": "shop", "url": mcp.url}]}
            )
            toolset = created["data"]["id"]
            with pytest.raises(nats.errors.Error):  # a harness may not issue tokens
                await harness.request(subjects.tokens_create, b"{}", timeout=2)
            token = await _request(
                issuer, subjects.tokens_create, {"namespace": "user-1", "toolsets": [toolset]}
            )
            assert token["ok"] is True, token
            async with mcp_client(f"http://127.0.0.1:{port}/mcp/{toolset}", token["data"]["token"]) as client:
                result = await client.call_tool("shop.echo", {"text": "secured"})
                tools = await client.list_tools()
            async with mcp_client(
                f"http://127.0.0.1:{port}/mcp/{toolset}?tools=search", token["data"]["token"]
            ) as client:  # the large-toolset mode reads the namespace catalogue and declarations
                meta = await client.list_tools()
                shop = await client.call_tool("list_tools", {"namespace": "shop"})
                hits = await client.call_tool("search_tools", {"query": "echo", "namespaces": ["shop"]})
            assert result.structured_content == {"text": "secured"}
            assert "- shop (mcp, 3 tools)" in (meta.tools[0].description or "")
            assert shop.is_error is False and hits.is_error is False, (shop, hits)
            assert "shop.echo" in [t.name for t in tools.tools]
    finally:
        await drop_redis_keys(redis_url, prefix)
    log = await asyncio.to_thread(Path(server.server.log_path).read_text, errors="replace")
    refused = [line for line in log.splitlines() if " Violation - " in line and "tokens.create" not in line]
    assert refused == [], refused
    assert [e for e in errors if "tokens.create" not in e] == []
