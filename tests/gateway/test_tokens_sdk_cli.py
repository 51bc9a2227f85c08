"""Gateway tokens from the Python SDK (`tb.tokens`) and the CLI (`toolbus tokens ...`): issued
for a namespace and toolsets, usable at the MCP endpoint, listed without the token, revoked."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from toolbus import Toolbus
from toolbus._errors import NotFound

from tests.gateway.conftest import Deployment, mcp_client

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_sdk_issues_lists_and_revokes(deployment: Deployment, toolset: str) -> None:
    async with await Toolbus.connect(deployment.env["TOOLBUS_NATS_URL"], deployment.prefix) as tb:
        issued = await tb.tokens.create("sdk-user", [toolset], ttl="1h", label="laptop")
        assert issued.token.startswith("tbg_") and issued.info.namespace == "sdk-user"
        async with mcp_client(deployment.url(toolset), issued.token) as client:
            result = await client.call_tool("shop.echo", {"text": "sdk token"})
        assert result.structured_content == {"text": "sdk token"}
        listed = await tb.tokens.list("sdk-user")
        assert [(t.id, t.label, t.toolsets) for t in listed] == [(issued.info.id, "laptop", [toolset])]
        await tb.tokens.revoke(issued.info.id)
        assert await tb.tokens.list("sdk-user") == []
        with pytest.raises(NotFound):
            await tb.tokens.revoke(issued.info.id)


def _cli(deployment: Deployment, *args: str) -> dict[str, object]:
    env = {
        **os.environ,
        "TOOLBUS_NATS_URL": deployment.env["TOOLBUS_NATS_URL"],
        "TOOLBUS_SUBJECT_PREFIX": deployment.prefix,
    }
    done = subprocess.run(
        [sys.executable, "-m", "toolbus", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, object] = json.loads(done.stdout)
    return out


async def test_cli_issues_lists_and_revokes(deployment: Deployment, toolset: str) -> None:
    created = await asyncio.to_thread(
        _cli, deployment, "tokens", "create", "--namespace", "cli-user", "--toolset", toolset
    )
    token, info = str(created["token"]), created["info"]
    assert isinstance(info, dict) and info["namespace"] == "cli-user" and info["toolsets"] == [toolset]
    async with mcp_client(deployment.url(toolset), token) as client:
        assert (await client.call_tool("shop.echo", {"text": "cli"})).structured_content == {"text": "cli"}
    listed = await asyncio.to_thread(_cli, deployment, "tokens", "list", "--namespace", "cli-user")
    assert listed == {"tokens": [info]}
    revoked = await asyncio.to_thread(_cli, deployment, "tokens", "revoke", str(info["id"]))
    assert revoked == {"id": info["id"], "revoked": True}
