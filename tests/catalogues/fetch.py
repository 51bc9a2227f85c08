"""Real MCP servers' tool lists, for tests and benches of declarations and search.

`load_catalogues()` returns `{server name: [tool as the server listed it, camelCase keys]}`. Each
server is an npm package installed into `.cache/npm` (on first use) and started over stdio with
the MCP SDK client; what it lists is cached as JSON under `.cache/catalogues/<name>.json`, so
later runs start no process. A server that can't be installed or started (npm unreachable, a
package gone) is left out with a reason in `last_skipped`; nothing here raises for it.

Set `TOOLBUS_CATALOGUES_REFRESH=1` to list every server again.

    python -m tests.catalogues.fetch          # fetch, cache and summarise
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NPM_PREFIX = ROOT / ".cache" / "npm"
CACHE_DIR = ROOT / ".cache" / "catalogues"
LIST_TIMEOUT_S = 60.0
INSTALL_TIMEOUT_S = 240.0


@dataclass(frozen=True)
class NpmServer:
    """An MCP server shipped as an npm package: how to start it so it lists its tools."""

    name: str
    package: str
    bin: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


SERVERS: tuple[NpmServer, ...] = (
    NpmServer("everything", "@modelcontextprotocol/server-everything", "mcp-server-everything", ("stdio",)),
    NpmServer("filesystem", "@modelcontextprotocol/server-filesystem", "mcp-server-filesystem", ("{tmp}",)),
    NpmServer(
        "memory",
        "@modelcontextprotocol/server-memory",
        "mcp-server-memory",
        (),
        (("MEMORY_FILE_PATH", "{tmp}/memory.json"),),
    ),
    NpmServer(
        "sequential_thinking",
        "@modelcontextprotocol/server-sequential-thinking",
        "mcp-server-sequential-thinking",
    ),
    NpmServer(
        "github",
        "@modelcontextprotocol/server-github",
        "mcp-server-github",
        (),
        (("GITHUB_PERSONAL_ACCESS_TOKEN", "unused-for-listing"),),
    ),
    NpmServer(
        "notion",
        "@notionhq/notion-mcp-server",
        "notion-mcp-server",
        (),
        (("NOTION_TOKEN", "unused-for-listing"),),
    ),
    NpmServer("playwright", "@playwright/mcp", "playwright-mcp", ("--headless",)),
)

last_skipped: dict[str, str] = {}
"""Why each server left out of the last `load_catalogues()` was left out."""


def _bin_path(server: NpmServer) -> Path:
    return NPM_PREFIX / "node_modules" / ".bin" / server.bin


def _install(servers: list[NpmServer]) -> str | None:
    """Install the missing packages in one npm run; the reason it failed, or None."""
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not on PATH"
    NPM_PREFIX.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            [
                npm,
                "install",
                "--prefix",
                str(NPM_PREFIX),
                "--no-audit",
                "--no-fund",
                *(s.package for s in servers),
            ],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"npm install failed: {exc}"
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"npm install exited {done.returncode}: {tail[0]}"
    return None


def _tool_dict(tool: Any) -> dict[str, Any]:
    data: dict[str, Any] = tool.model_dump(mode="json", by_alias=True, exclude_none=True)
    return data


async def _list_tools(server: NpmServer, tmp: str) -> list[dict[str, Any]]:
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    env = dict(os.environ)
    env.update({k: v.replace("{tmp}", tmp) for k, v in server.env})
    params = StdioServerParameters(
        command=str(_bin_path(server)),
        args=[a.replace("{tmp}", tmp) for a in server.args],
        env=env,
        cwd=tmp,
    )
    tools: list[dict[str, Any]] = []
    # The servers' own chatter on stderr ("running on stdio") is noise here.
    with open(os.devnull, "w") as errlog:  # noqa: ASYNC230 - opening /dev/null does not block
        async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=LIST_TIMEOUT_S) as client:
            cursor: str | None = None
            while True:
                result = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
                tools.extend(_tool_dict(t) for t in result.tools)
                cursor = result.next_cursor
                if not cursor:
                    break
    return tools


def _fetch(server: NpmServer) -> list[dict[str, Any]]:
    """List one server's tools in a thread of its own (so a caller's event loop is no obstacle)."""
    import anyio

    box: dict[str, Any] = {}

    def run() -> None:
        with tempfile.TemporaryDirectory(prefix=f"toolbus-{server.name}-") as tmp:
            try:
                box["tools"] = anyio.run(_with_timeout, server, tmp)
            except BaseException as exc:  # a server's failure is reported, never raised
                box["error"] = exc

    thread = threading.Thread(target=run, name=f"catalogue-{server.name}", daemon=True)
    thread.start()
    thread.join(LIST_TIMEOUT_S + 10)
    if "tools" in box:
        tools: list[dict[str, Any]] = box["tools"]
        return tools
    raise RuntimeError(f"listing failed: {box.get('error', 'timed out')!r}")


async def _with_timeout(server: NpmServer, tmp: str) -> list[dict[str, Any]]:
    import anyio

    with anyio.fail_after(LIST_TIMEOUT_S):
        return await _list_tools(server, tmp)


def load_catalogues(
    names: list[str] | None = None, *, refresh: bool | None = None
) -> dict[str, list[dict[str, Any]]]:
    """{server name: tools as listed} for the real servers that could be reached, in SERVERS order.

    Cached servers are read from `.cache/catalogues/`; missing ones are installed and listed.
    """
    if refresh is None:
        refresh = os.environ.get("TOOLBUS_CATALOGUES_REFRESH") == "1"
    wanted = [s for s in SERVERS if names is None or s.name in names]
    last_skipped.clear()
    out: dict[str, list[dict[str, Any]]] = {}
    to_list: list[NpmServer] = []
    for server in wanted:
        cached = CACHE_DIR / f"{server.name}.json"
        if cached.exists() and not refresh:
            try:
                out[server.name] = json.loads(cached.read_text())
                continue
            except (OSError, ValueError):
                pass
        to_list.append(server)
    missing = [s for s in to_list if not _bin_path(s).exists()]
    if missing:
        reason = _install(missing)
        if reason is not None:
            # One bad package fails the whole npm run: try the others one by one.
            for server in missing:
                if _install([server]) is not None:
                    last_skipped[server.name] = reason
    for server in to_list:
        if server.name in last_skipped:
            continue
        if not _bin_path(server).exists():
            last_skipped[server.name] = f"{server.package} did not install {server.bin}"
            continue
        try:
            tools = _fetch(server)
        except RuntimeError as exc:
            last_skipped[server.name] = str(exc)
            continue
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        (CACHE_DIR / f"{server.name}.json").write_text(json.dumps(tools, indent=1, sort_keys=True))
        out[server.name] = tools
    return {s.name: out[s.name] for s in wanted if s.name in out}


def main() -> None:
    catalogues = load_catalogues()
    for name, tools in catalogues.items():
        size = len(json.dumps(tools))
        print(f"{name:22} {len(tools):4} tools {size:8} bytes")
    for name, reason in last_skipped.items():
        print(f"{name:22} skipped: {reason}", file=sys.stderr)


if __name__ == "__main__":
    main()
