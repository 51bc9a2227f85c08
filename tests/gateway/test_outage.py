"""A backing store away while checking a token is 503 (try again), never a 500: the gateway's
HTTP app with its token store on a Redis port where nothing listens."""

from __future__ import annotations

from typing import Any, cast

import httpx
import pytest
from redis.asyncio import Redis
from toolbus_contracts import Subjects
from toolbus_gateway.auth import Authenticator
from toolbus_gateway.gateway import Gateway
from toolbus_gateway.mcp_server import build_app
from toolbus_gateway.tokens import TokenStore

from tests.support.infra import free_port

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_token_store_away_is_503() -> None:
    redis: Redis[bytes] = Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=1)
    unused = cast(Any, None)  # never reached: the request stops at the bearer check
    gateway = Gateway(
        Authenticator(TokenStore(redis, "tbgw-outage"), None),
        unused,
        unused,
        unused,
        unused,
        Subjects("tbgw-outage"),
        page_size=10,
        large_toolset=10,
        reconnect_url=None,
        authorization_servers=[],
    )
    app = build_app(gateway, base_url="http://127.0.0.1:1", max_body=1024, host="127.0.0.1")
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:1"
    ) as http:
        reply = await http.post(
            "/mcp/ts_" + "a" * 64,
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={"Authorization": "Bearer tbg_whatever"},
        )
    await redis.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag
    assert reply.status_code == 503
    assert reply.json()["error"]["message"] == "The gateway cannot check tokens right now; try again."
