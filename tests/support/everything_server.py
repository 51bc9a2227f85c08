"""The npm reference MCP server `@modelcontextprotocol/server-everything` (installed by
`make npm-tools` under .cache/npm) over streamable HTTP on a free port, for the tests that check
toolbus against it: `async with everything_server() as url:`."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tests.support.gates import missing
from tests.support.infra import free_port

ROOT = Path(__file__).resolve().parents[2]
ENTRY = Path("node_modules/@modelcontextprotocol/server-everything/dist/index.js")


def _find_entry() -> Path | None:
    for base in (ROOT / ".cache" / "npm", ROOT):
        if (base / ENTRY).is_file():
            return base / ENTRY
    return None


@asynccontextmanager
async def everything_server() -> AsyncIterator[str]:
    """Its `/mcp` URL once it listens (within 10 s); stopped after. Without node or the package:
    `missing` (skips on a developer's machine, fails in CI)."""
    node, entry = shutil.which("node"), _find_entry()
    if node is None or entry is None:
        missing("node or @modelcontextprotocol/server-everything (make npm-tools) is not installed")
    port = free_port()
    proc = subprocess.Popen(  # noqa: ASYNC220 - starting a process does not block; waiting is async
        [node, str(entry), "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                assert proc.poll() is None, "server-everything exited at start"
                await asyncio.sleep(0.05)
                continue
            writer.close()
            await writer.wait_closed()
            break
        else:
            raise AssertionError("server-everything did not listen within 10 s")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 5)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)
