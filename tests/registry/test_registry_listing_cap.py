"""The registry reads a server's tool listing up to `TOOLBUS_REGISTRY_MAX_LISTING_BYTES`, against
real NATS (JetStream) and real MCP servers over streamable HTTP: a listing over it (in one answer,
or over many pages) is `upstreamError` naming the server (the protocol's code for a server that
misbehaves during listing), nothing is pinned, and the registry goes on serving."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from toolbus_common import Settings
from toolbus_contracts import Subjects
from toolbus_registry.app import RegistryApp

from tests.support.infra import request
from tests.support.mcp_servers import McpTestServer, synthetic_server

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

CAP = 64 * 1024


class _NoCredentials:
    async def set_toolset(self, toolset_id: str, credentials: Any) -> None:  # pragma: no cover
        raise AssertionError("these toolsets carry no credentials")


@pytest.fixture(scope="module")
def settings(service_env: dict[str, str]) -> Settings:
    env: dict[str, Any] = {k.removeprefix("TOOLBUS_").lower(): v for k, v in service_env.items()}
    return Settings(**env, registry_max_listing_bytes=CAP)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def registry(settings: Settings) -> AsyncIterator[RegistryApp]:
    app = RegistryApp(settings, credentials=_NoCredentials())
    await app.start()
    yield app
    await app.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def servers() -> AsyncIterator[dict[str, McpTestServer]]:
    started = {
        "whole": synthetic_server(200),  # ~200 KB in one answer
        "paged": synthetic_server(200, page_size=20),  # ~20 KB a page, ~200 KB in all
        "small": synthetic_server(10),
    }
    for s in started.values():
        await s.start()
    yield started
    for s in started.values():
        await s.stop()


async def _create(nc: Any, subjects: Subjects, name: str, server: McpTestServer) -> dict[str, Any]:
    return await request(
        nc, subjects.toolsets_create, {"mcp": [{"name": name, "url": server.url}]}, timeout=30
    )


@pytest.mark.parametrize("which", ["whole", "paged"])
async def test_a_listing_over_the_cap_is_upstream_error_naming_the_server_and_the_registry_goes_on(
    nc: Any, settings: Settings, registry: RegistryApp, servers: dict[str, McpTestServer], which: str
) -> None:
    subjects = settings.subjects
    reply = await _create(nc, subjects, which, servers[which])
    assert reply["ok"] is False, str(reply)[:300]
    error = reply["error"]
    assert error["code"] == "upstreamError", error
    assert f"'{which}'" in error["message"] and str(CAP) in error["message"], error
    assert error["details"]["server"] == which
    small = await _create(nc, subjects, "small", servers["small"])
    assert small["ok"], small
    assert (
        len([t for t in small["data"]["tools"] if t["kind"] == "mcp"]) == 13
    )  # 10 synthetic and the 3 echo tools
