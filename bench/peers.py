"""`make bench-peers`: the same MCP echo call through IBM ContextForge (`mcp-contextforge-gateway`,
a Python MCP gateway) beside the direct call and toolbus's `calls.invoke`, in one run.

ContextForge is installed in its own virtual environment under `.cache/contextforge-venv` (not the
project's: it pins its own FastAPI, SQLAlchemy, mcp, ...), started by this bench on a free
loopback port with a fresh SQLite database, once with its defaults (stateless streamable HTTP:
a new upstream session per call) and once with `USE_STATEFUL_SESSIONS=true`, and stopped after.
The echo server is registered as a gateway (`POST /gateways`, streamable HTTP), its tool put in a
virtual server (`POST /servers`), and called through `/servers/<id>/mcp` with a bare `mcp.Client`
(Bearer JWT made with ContextForge's own `create_jwt_token`). Its settings beyond the defaults
are only what a loopback bench needs: `SSRF_ALLOW_LOCALHOST=true` (the echo server is on
127.0.0.1), `RATE_LIMITING_ENABLED=false` (its default limit of 100 MCP requests a minute turns
most calls of a throughput run into 429s), the admin API on and the UI off, random secrets.

Optional, not in CI: when ContextForge cannot be installed or started, it prints why and exits 0.

    uv run python bench/peers.py [--calls 300] [--version 1.0.7]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, cast

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import RequestParamsMeta
from toolbus_mcp_client import IDEMPOTENCY_META_KEY, McpConnection

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import (
    Call,
    Figure,
    Row,
    in_flight,
    latency_figures,
    merge,
    print_table,
    rss_mib,
    sequential,
)
from bench.stack import BenchStack
from tests.support.infra import free_port

VENV = ROOT / ".cache" / "contextforge-venv"
VERSION = "1.0.7"  # the version FACTS.md measured
SECTION = "peer gateway: IBM ContextForge"


def _uv() -> str | None:
    """uv: the one running this bench (`uv run` names itself in `UV`), on PATH, or the Makefile's
    own copy (`.cache/uv`, where none is on PATH)."""
    for candidate in (os.environ.get("UV"), shutil.which("uv"), str(ROOT / ".cache" / "uv" / "bin" / "uv")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def install(version: str) -> str | None:
    """Install ContextForge into its own venv (once); the reason when it cannot be."""
    python = VENV / "bin" / "python"
    check = [str(python), "-c", "import mcpgateway; print(mcpgateway.__version__)"]
    if python.exists():
        got = subprocess.run(check, capture_output=True, text=True, check=False)
        if got.returncode == 0 and got.stdout.strip() == version:
            return None
    uv = _uv()
    if uv is None:
        return "uv is not installed (`make bench-peers` installs it: it runs this bench with `uv run`)"
    steps = [
        [uv, "venv", "-q", "--allow-existing", "-p", sys.executable, str(VENV)],
        [uv, "pip", "install", "-q", "-p", str(python), f"mcp-contextforge-gateway=={version}"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return f"`{' '.join(step)}` failed: {(done.stderr or done.stdout).strip()[-600:]}"
    return None


class ContextForge:
    """One ContextForge process on a free loopback port, with its own SQLite database."""

    def __init__(self, stateful: bool) -> None:
        self.stateful = stateful
        self.tool = ""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="contextforge-"))
        self.secret = secrets.token_hex(32)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("TOOLBUS_", "VIRTUAL_ENV"))},
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
            "DATABASE_URL": f"sqlite:///{self.dir}/mcp.db",
            "JWT_SECRET_KEY": self.secret,
            "AUTH_ENCRYPTION_SECRET": secrets.token_hex(32),
            "BASIC_AUTH_PASSWORD": "B!" + secrets.token_hex(16),
            "PLATFORM_ADMIN_EMAIL": "admin@example.com",
            "PLATFORM_ADMIN_PASSWORD": "P!" + secrets.token_hex(16) + "aA1",
            "MCPGATEWAY_UI_ENABLED": "false",
            "MCPGATEWAY_ADMIN_API_ENABLED": "true",
            "SSRF_ALLOW_LOCALHOST": "true",
            # Its default rate limiting (100 MCP requests a minute per client, a burst of 20, a
            # 15-minute lockout after 5 violations) answers most of a throughput bench with 429:
            # that, not its own speed, is what failed with 16 in flight before.
            "RATE_LIMITING_ENABLED": "false",
            "USE_STATEFUL_SESSIONS": "true" if stateful else "false",
            "LOG_LEVEL": "ERROR",
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.token = ""

    def start(self) -> None:
        log = (self.dir / "gateway.log").open("wb")
        self.proc = subprocess.Popen(
            [str(VENV / "bin" / "mcpgateway"), "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=self.dir,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ContextForge exited: {self.log()}")
            try:
                if httpx2.get(f"{self.base}/health", timeout=1).status_code == 200:
                    break
            except httpx2.HTTPError:
                pass
            time.sleep(0.3)
        else:
            raise RuntimeError(f"ContextForge did not answer /health in 300 s: {self.log()}")
        made = subprocess.run(
            [str(VENV / "bin" / "python"), "-m", "mcpgateway.utils.create_jwt_token", "-u", "admin@example.com",
             "--exp", "120", "--secret", self.secret],
            cwd=self.dir, env=self.env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        self.token = made.stdout.strip().splitlines()[-1]

    def log(self) -> str:
        path = self.dir / "gateway.log"
        return path.read_text(errors="replace")[-1500:] if path.exists() else ""

    def api(self, method: str, path: str, body: Any = None) -> Any:
        r = httpx2.request(
            method,
            f"{self.base}{path}",
            json=body,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=60,
        )
        if r.status_code >= 300:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:500]}")
        return r.json()

    def serve_echo(self, url: str) -> str:
        """Register the echo server and a virtual server with its echo tool; its MCP URL."""
        self.api(
            "POST",
            "/gateways",
            {"name": f"echo{uuid.uuid4().hex[:6]}", "url": url, "transport": "STREAMABLEHTTP"},
        )
        tools = self.api("GET", "/tools")
        tools = tools.get("items", tools) if isinstance(tools, dict) else tools
        echo = next(t for t in tools if t.get("originalName", t.get("original_name")) == "echo")
        server = self.api("POST", "/servers", {"server": {"name": "bench", "associated_tools": [echo["id"]]}})
        self.tool = echo["name"]
        return f"{self.base}/servers/{server['id']}/mcp"

    def start_serving(self, url: str) -> str:
        self.start()
        return self.serve_echo(url)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def leaf_errors(exc: BaseException) -> str:
    """The innermost exceptions of an exception (group), as `Type: message`, deduplicated."""
    leaves: list[str] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                walk(sub)
        else:
            text = f"{type(e).__name__}: {str(e)[:200]}"
            if text not in leaves:
                leaves.append(text)

    walk(exc)
    return "; ".join(leaves) or type(exc).__name__


async def own_client(token: str, url: str, opened: asyncio.Future[Any], finished: asyncio.Event) -> None:
    """Open a bare `mcp.Client` on a gateway, hand it over, keep it open until `finished`."""
    try:
        async with (
            create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http,
            Client(streamable_http_client(url, http_client=http), mode="auto") as client,
        ):
            opened.set_result(client)
            await finished.wait()
    except BaseException as exc:
        if not opened.done():
            if isinstance(exc, asyncio.CancelledError):
                opened.cancel()
            else:
                opened.set_exception(exc)
        raise


async def main(calls: int, version: str) -> None:
    why = install(version)
    if why is not None:
        print(f"bench-peers: ContextForge {version} could not be installed, nothing measured: {why}")
        return
    from bench.harness import commit

    info = commit()
    async with BenchStack(("registry", "dispatcher")) as stack:
        conn = await McpConnection.open(stack.url, {}, server_name="echo")
        http = create_mcp_http_client()
        bare = Client(streamable_http_client(stack.url, http_client=http), mode="auto")
        await http.__aenter__()
        await bare.__aenter__()

        async def direct() -> object:
            return await conn.call_tool("echo", {"text": "hi"}, idempotency_key=uuid.uuid4().hex, timeout=30)

        async def sdk() -> object:
            meta = cast(RequestParamsMeta, {IDEMPOTENCY_META_KEY: uuid.uuid4().hex})
            return await bare.call_tool("echo", {"text": "hi"}, meta=meta)

        paths: dict[str, Call] = {
            "direct McpConnection": direct,
            "direct bare mcp.Client": sdk,
            "toolbus calls.invoke": stack.invoke,
        }
        gateways: list[ContextForge] = []
        owners: dict[str, asyncio.Task[None]] = {}
        finished = asyncio.Event()
        rss: dict[str, float] = {}
        errors: dict[str, dict[str, int]] = {}
        died: dict[str, str] = {}
        try:
            gateways = [ContextForge(stateful) for stateful in (False, True)]
            started = await asyncio.gather(
                *(asyncio.to_thread(gw.start_serving, stack.url) for gw in gateways), return_exceptions=True
            )
            for gw, mcp_url in zip(gateways, started, strict=True):
                label = f"ContextForge {version}, {'stateful sessions' if gw.stateful else 'defaults'}"
                if isinstance(mcp_url, BaseException):  # report and go on: the peer is optional
                    print(f"{label}: could not be started or configured: {mcp_url}")
                    continue
                # The SDK client runs its transport in a task group whose cancel scope belongs to
                # the task that opened it: when the gateway's transport fails (as it did with 16
                # in flight), that task is cancelled. Opened here, that was this bench's main
                # task: the CancelledError got past the per-call `except Exception`, the cleanup
                # failed on the cancelled scope and nothing was printed. So each gateway's client
                # is opened and owned by a task of its own, and what ended it is reported.
                opened: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                owner = asyncio.create_task(own_client(gw.token, mcp_url, opened, finished))
                owners[label] = owner
                try:
                    gw_client = await opened
                except BaseException as exc:
                    print(f"{label}: its MCP session could not be opened: {leaf_errors(exc)}")
                    continue

                async def through(client: Any = gw_client, tool: str = gw.tool, label: str = label) -> object:
                    try:
                        async with asyncio.timeout(60):
                            result = await client.call_tool(tool, {"text": "hi"})
                        if result.is_error:
                            raise RuntimeError(str(result.content)[:200])
                        return result
                    except Exception as exc:  # counted and reported: a gateway that fails under load
                        failed = errors.setdefault(label, {})
                        key = f"{type(exc).__name__}: {str(exc)[:120]}"
                        failed[key] = failed.get(key, 0) + 1
                        return None

                paths[label] = through
            got: dict[tuple[str, str], list[Row]] = {}
            for name, fn in paths.items():
                print(f"warming up: {name}", file=sys.stderr)
                await sequential(fn, 20)
            for _ in range(2):
                for name, fn in paths.items():
                    got.setdefault((name, "sequential"), []).append(await sequential(fn, calls))
                    got.setdefault((name, "16 in flight"), []).append(await in_flight(fn, calls))
            for gw in gateways:
                if gw.proc is not None and gw.proc.poll() is None:
                    rss[
                        f"ContextForge {'stateful' if gw.env['USE_STATEFUL_SESSIONS'] == 'true' else 'defaults'}"
                    ] = rss_mib(gw.proc.pid)
        finally:
            finished.set()
            for label, owner in owners.items():
                try:
                    await asyncio.wait_for(owner, 30)
                except BaseException as exc:  # the gateway's transport failed under load: say how
                    died[label] = leaf_errors(exc)
            for gw in gateways:
                await asyncio.to_thread(gw.stop)
            await bare.__aexit__(None, None, None)
            await http.__aexit__(None, None, None)
            await conn.aclose()
    figures: list[Figure] = []
    for name in paths:
        if name.startswith("direct McpConnection"):
            continue
        for mode in ("sequential", "16 in flight"):
            figures += latency_figures(
                SECTION,
                f"{name}, {mode}:",
                merge(got[(name, mode)]),
                "direct McpConnection",
                merge(got[("direct McpConnection", mode)]),
            )
    for name, value in rss.items():
        figures.append(Figure(SECTION, f"{name} RSS after the calls", value, "MiB"))
    for name, failed in errors.items():
        for what, count in failed.items():
            figures.append(Figure(SECTION, f"{name}: calls that failed", count, "calls", note=what))
    for name, why in died.items():
        print(f"{name}: its MCP client session ended with: {why}")
    print_table(
        figures,
        f"bench-peers on commit {info['commit']}{' (dirty)' if info['dirty'] else ''}; {calls} calls per row and round,"
        " 2 rounds; a shared 2-core machine, loopback only",
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--version", default=VERSION)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.version))
