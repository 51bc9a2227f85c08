"""The TypeScript SDK's client (`@modelcontextprotocol/sdk` from npm) through the gateway: it
lists every page and calls a tool with a bearer token (`make npm-tools` installs it; without it the
test skips, and fails in CI). Run with `-s` to see its transcript."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.gateway.conftest import Deployment
from tests.support.gates import missing

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

NPM = Path(__file__).resolve().parents[2] / ".cache" / "npm"
SCRIPT = Path(__file__).with_name("ts_client.mjs")


async def test_typescript_client_lists_and_calls(deployment: Deployment, toolset: str) -> None:
    node = shutil.which("node")
    if node is None or not (NPM / "node_modules/@modelcontextprotocol/sdk/package.json").is_file():
        missing("node or @modelcontextprotocol/sdk is not installed (make npm-tools)")
    (NPM / SCRIPT.name).write_text(SCRIPT.read_text())  # beside node_modules, so imports resolve
    token = await deployment.token([toolset], namespace="ts-user")
    done = await asyncio.to_thread(
        subprocess.run,
        [node, str(NPM / SCRIPT.name), deployment.url(toolset), token, "shop.echo", "from typescript"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    transcript = json.loads(done.stdout)
    assert transcript["pages"] == 4 and len(transcript["names"]) == 18
    assert "shop.echo" in transcript["names"]
    assert transcript["result"]["structuredContent"] == {"text": "from typescript"}
    assert transcript["result"].get("isError", False) is False
