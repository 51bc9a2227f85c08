"""The credentials service's OAuth pages as a browser gets them: the service runs as a process.

Proves: the page for an unknown connect link and the page for a callback with an unknown state
carry the same security headers as the approvals console (a content security policy, no
framing, no sniffing, no referrer, no caching), and say what happened.
"""

from __future__ import annotations

import httpx
import nats
import pytest
from toolbus_common.web_headers import SECURITY_HEADERS
from toolbus_devstack.processes import free_port

from tests.support.infra import aservice_process, drop_deployment_state, unique_prefix

pytestmark = pytest.mark.e2e


async def test_the_oauth_pages_carry_the_security_headers(
    service_env: dict[str, str], nats_url: str, redis_url: str
) -> None:
    prefix = unique_prefix("tbop")
    port = free_port()
    env = {
        **service_env,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_REDIS_PREFIX": prefix,
        "TOOLBUS_OAUTH_CALLBACK_URL": f"http://127.0.0.1:{port}/oauth/callback",
    }
    nc = await nats.connect(nats_url)
    try:
        async with (
            aservice_process("credentials", env, port=port),
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
        ):
            expired = await http.get("/oauth/start/not-a-link")
            assert expired.status_code == 400 and "Link expired" in expired.text
            unknown = await http.get("/oauth/callback", params={"state": "not-a-state", "code": "x"})
            assert unknown.status_code == 400 and "Not connected" in unknown.text
            for page in (expired, unknown):
                assert {name: page.headers.get(name) for name in SECURITY_HEADERS} == SECURITY_HEADERS
    finally:
        await drop_deployment_state(nc, redis_url, prefix)
        await nc.drain()
