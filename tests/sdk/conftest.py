"""The SDK's tests run against the real services as processes (registry, dispatcher, approval,
credentials) under a subject prefix of their own, on the session's real NATS and Redis, with real
MCP servers over streamable HTTP."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.support.infra import aservice_process, drop_deployment_state, js_name, unique_prefix
from tests.support.mcp_servers import McpTestServer, echo_tools

SERVICES = ("registry", "dispatcher", "approval", "credentials")


@pytest.fixture(scope="package")
def sdk_env(service_env: dict[str, str]) -> dict[str, str]:
    """The settings of this package's deployment (and of the CLI and examples it runs)."""
    prefix = unique_prefix("tbsdk")
    return {
        **service_env,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_REDIS_PREFIX": prefix,
        "TOOLBUS_PARK_NOTIFY_DELAY": "100ms",
        "TOOLBUS_LOG_FORMAT": "json",
    }


@pytest_asyncio.fixture(scope="package", loop_scope="session")
async def stack(sdk_env: dict[str, str], nc: Any, redis_url: str) -> AsyncIterator[dict[str, str]]:
    """The four services as processes, ready; their state is deleted at the end."""
    prefix = sdk_env["TOOLBUS_SUBJECT_PREFIX"]
    try:
        async with contextlib.AsyncExitStack() as services:
            for name in SERVICES:
                await services.enter_async_context(aservice_process(name, sdk_env))
            yield sdk_env
    finally:
        await drop_deployment_state(nc, redis_url, prefix)
        with contextlib.suppress(Exception):
            await nc.jetstream().delete_stream(f"OBJ_{js_name(prefix, 'outputs')}")


@pytest_asyncio.fixture(scope="package", loop_scope="session")
async def tb(stack: dict[str, str]) -> AsyncIterator[Any]:
    """A connected `Toolbus` on this package's deployment."""
    from toolbus import Toolbus

    async with await Toolbus.connect(stack["TOOLBUS_NATS_URL"], stack["TOOLBUS_SUBJECT_PREFIX"]) as client:
        yield client


def _slow_tools() -> list[dict[str, Any]]:
    return [
        *echo_tools(),
        {
            "name": "big",
            "description": "Return a text of n characters.",
            "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        },
    ]


async def _handler(name: str, arguments: dict[str, Any]) -> Any:
    from tests.support.mcp_servers import echo_handler

    if name == "big":
        return {"text": "x" * int(arguments["n"])}
    return await echo_handler(name, arguments)


@pytest_asyncio.fixture(scope="package", loop_scope="session")
async def mcp_server() -> AsyncIterator[McpTestServer]:
    """A real MCP server (`echo`, `plain`, `fail`, `big`) over streamable HTTP."""
    async with McpTestServer(tools=_slow_tools(), handler=_handler, name="everything") as server:
        yield server
