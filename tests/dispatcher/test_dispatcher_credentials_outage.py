"""A Redis outage while the dispatcher resolves a call's credentials (a cache miss: the first call
of a run) is a store step like the others: waited out, never the call's outcome, never counted as
sent. Real dispatcher, NATS and MCP server; the credentials store reads a real Redis through a TCP
proxy (`tests/support/cutting_proxy.py`) that is down (connections reset, new ones refused) for
~1.5 s around the call, or for the whole attempt."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from cryptography.fernet import Fernet
from redis.asyncio import Redis
from toolbus_common.credential_store import CredentialStore
from toolbus_common.secrets import Cipher
from toolbus_contracts.credentials import Credentials
from toolbus_dispatcher.credentials import StoreCredentials

from tests.dispatcher.test_dispatcher_helpers import Harness
from tests.dispatcher.test_dispatcher_mcp import mcp_toolset
from tests.support.cutting_proxy import CuttingProxy, proxy_to
from tests.support.mcp_servers import McpTestServer, token_server

pytestmark = pytest.mark.integration

TOKEN = "t-outage"


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def proxy(redis_url: str) -> AsyncIterator[CuttingProxy]:
    async with proxy_to(redis_url) as p:
        yield p


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def server() -> AsyncIterator[McpTestServer]:
    async with token_server(TOKEN, name="echo") as srv:
        yield srv


async def test_redis_down_during_the_first_credential_lookup_delays_an_at_most_once_call(
    nats_url: str, redis_url: str, proxy: CuttingProxy, server: McpTestServer
) -> None:
    h = Harness(nats_url, redis_url)
    await h.connect()
    cipher = Cipher(Fernet.generate_key().decode())
    through_proxy: Redis[bytes] = Redis.from_url(proxy.url)
    try:
        await h.dispatcher(credentials=StoreCredentials(CredentialStore(through_proxy, h.keys, cipher)))
        direct = CredentialStore(h.redis, h.keys, cipher)  # type: ignore[arg-type]
        await direct.set(
            "toolset",
            toolset_id=(ts := await mcp_toolset(h, server.url, echo={"onInterruption": "at_most_once"})),
            credentials=Credentials.model_validate(
                {"servers": {"echo": {"headers": {"Authorization": f"Bearer {TOKEN}"}}}}
            ),
        )
        run = await h.open_run(ts)
        before = len(server.calls_to("echo"))
        proxy.down()  # the credentials store's Redis: existing connections reset, new ones refused
        asyncio.get_running_loop().call_later(1.5, proxy.up)
        data = await h.invoke(run, "echo.echo", {"text": "once"})
        assert proxy.refused > 0  # the lookup did meet the outage
        assert data["outcome"] == {"status": "ok", "output": {"text": "once"}}, data
        got = await h.ok(h.subjects.calls_get, {"callId": data["callId"]})
        assert got["attempts"] == 1, got
        calls = server.calls_to("echo")[before:]
        assert len(calls) == 1 and calls[0].authorized
    finally:
        proxy.up()
        await h.close()
        await through_proxy.aclose()  # type: ignore[attr-defined]


async def test_redis_down_for_the_whole_attempt_times_out_unsent_so_at_most_once_is_sent_later(
    nats_url: str, redis_url: str, proxy: CuttingProxy, server: McpTestServer
) -> None:
    """Resolution waits within the attempt's timeout; an attempt that timed out there sent
    nothing, so even an at_most_once call is tried again (and ends `timeout` once the attempts are
    used up, never `outcomeUnknown`), and the server never sees it."""
    h = Harness(nats_url, redis_url)
    await h.connect()
    cipher = Cipher(Fernet.generate_key().decode())
    through_proxy: Redis[bytes] = Redis.from_url(proxy.url)
    try:
        await h.dispatcher(credentials=StoreCredentials(CredentialStore(through_proxy, h.keys, cipher)))
        ts = await mcp_toolset(h, server.url, echo={"onInterruption": "at_most_once", "timeout": "300ms"})
        run = await h.open_run(ts)
        before = len(server.calls_to("echo"))
        proxy.down()
        data = await h.invoke(run, "echo.echo", {"text": "never"})
        assert data["outcome"]["status"] == "error"
        assert data["outcome"]["error"]["code"] == "timeout", data
        got = await h.ok(h.subjects.calls_get, {"callId": data["callId"]})
        assert got["attempts"] == 5, got
        assert server.calls_to("echo")[before:] == []
    finally:
        proxy.up()
        await h.close()
        await through_proxy.aclose()  # type: ignore[attr-defined]
