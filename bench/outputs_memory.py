"""The dispatcher's peak memory with big outputs: its peak RSS (`VmHWM`) with no big output (the
baseline: a few small calls), one 20 MB MCP output, five at once, and one 63 MiB http.fetch body,
each on a fresh dispatcher process (real NATS, Redis, an MCP server and an HTTP server in processes
of their own). `--before PYTHON` runs the same scenarios on a second interpreter (e.g. another
checkout's `.venv/bin/python`) and prints both beside each other.

    uv run python bench/outputs_memory.py [--before /work/main/.venv/bin/python] [--memory MiB]

`--memory` sets `TOOLBUS_DISPATCHER_OUTPUT_MEMORY` on the dispatcher (the bound on large outputs
in flight; an interpreter that does not know it ignores it). Stops by itself; cleans up its
streams, buckets and keys.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.http_servers import serve_in_thread

NATS_URL = os.environ.get("TOOLBUS_NATS_URL", "nats://127.0.0.1:4222")
REDIS_URL = os.environ.get("TOOLBUS_REDIS_URL", "redis://127.0.0.1:6379/0")
MCP_SIZE = 20 * 1000 * 1000
HTTP_SIZE = 63 * 1024 * 1024
TOOLS = [{"name": n, "description": n, "inputSchema": {"type": "object"}} for n in ("big", "small")]


def serve_mcp() -> None:
    """The MCP server of the bench (run in its own process): `big` answers 20 MB of structured
    output, each call different bytes; `small` a few bytes. Prints its URL, serves until killed."""
    import mcp_types as types

    from tests.support.mcp_servers import McpTestServer

    async def handler(name: str, arguments: dict[str, Any]) -> Any:
        if name == "big":
            text = base64.b64encode(os.urandom(MCP_SIZE * 3 // 4)).decode()
            return types.CallToolResult(content=[], structured_content={"data": text})
        return {"small": True}

    server = McpTestServer(TOOLS, handler, name="big")
    server.start_blocking()
    print(server.url, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)


class _Files(BaseHTTPRequestHandler):
    body = os.urandom(HTTP_SIZE)

    def log_message(self, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(self.body)


def peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


SCENARIOS: list[tuple[str, str, int, int]] = [
    # (name, tool, calls at once, output bytes)
    ("none (baseline: 5 small calls)", "big.small", 5, 0),
    ("one 20 MB MCP output", "big.big", 1, MCP_SIZE),
    ("five 20 MB MCP outputs at once", "big.big", 5, MCP_SIZE),
    ("one 63 MiB http.fetch body", "http.fetch", 1, HTTP_SIZE),
]


async def scenario(
    python: str, mcp_url: str, http_port: int, tool: str, n: int, memory: int | None
) -> tuple[float, float]:
    """(peak RSS MiB, seconds) of a fresh dispatcher running `n` calls of `tool` at once."""
    from tests.dispatcher.test_dispatcher_helpers import Harness
    from tests.support.infra import launch_service, stop_process, wait_ready

    h = Harness(NATS_URL, REDIS_URL)
    await h.connect()
    from cryptography.fernet import Fernet

    extra = {
        "TOOLBUS_MAX_OUTPUT_BYTES": str(64 * 1024 * 1024),
        "TOOLBUS_SECRET_KEY": Fernet.generate_key().decode(),
        "TOOLBUS_EGRESS_ALLOW": "127.0.0.0/8,::1,localhost",  # where the checkout has egress rules
    }
    if memory is not None:
        extra["TOOLBUS_DISPATCHER_OUTPUT_MEMORY"] = str(memory)
    service = launch_service("dispatcher", h.env(**extra), python=python)
    try:
        await asyncio.to_thread(
            wait_ready, service.ready_url, service.proc, service.log_path, what="dispatcher", timeout=90
        )
        ts = await h.toolset(
            {"servers": [{"name": "big", "url": mcp_url, "tools": TOOLS}], "http": {"allow": ["127.0.0.1"]}}
        )
        run = await h.open_run(ts)
        inp = {"url": f"http://127.0.0.1:{http_port}/big"} if tool == "http.fetch" else {}
        await h.invoke(run, "big.small", {})  # warm: connections open, code paths loaded
        await asyncio.sleep(0.5)
        start = time.perf_counter()
        replies = await asyncio.gather(
            *(
                h.ok(h.subjects.calls_invoke, {"runId": run, "tool": tool, "input": inp}, 120)
                for _ in range(n)
            )
        )
        took = time.perf_counter() - start
        for reply in replies:
            outcome = reply["outcome"]
            assert outcome["status"] == "ok", outcome
        peak = peak_mib(service.proc.pid)
    finally:
        await asyncio.to_thread(stop_process, service.proc)
        await h.close()
    return peak, took


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", help="a second interpreter to run the same scenarios on (the 'before')")
    parser.add_argument("--memory", type=float, help="TOOLBUS_DISPATCHER_OUTPUT_MEMORY in MiB")
    parser.add_argument("--serve-mcp", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_mcp:
        serve_mcp()
        return
    memory = int(args.memory * 2**20) if args.memory else None
    pythons = [("after", sys.executable)]
    if args.before:
        pythons.insert(0, ("before", args.before))
    proc = subprocess.Popen(  # noqa: ASYNC220 - once, before anything is measured
        [sys.executable, __file__, "--serve-mcp"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        mcp_url = proc.stdout.readline().strip()
        results: dict[tuple[str, str], tuple[float, float]] = {}
        with serve_in_thread(ThreadingHTTPServer(("127.0.0.1", 0), _Files)) as port:
            for name, tool, n, _size in SCENARIOS:
                for label, python in pythons:
                    results[(label, name)] = await scenario(python, mcp_url, port, tool, n, memory)
                    print(f"  {label:6} {name}: {results[(label, name)][0]:.0f} MiB", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"\ndispatcher peak RSS (VmHWM), fresh process per row; bound: {args.memory or 'default'} MiB")
    head = f"{'scenario':34}" + "".join(
        f"{label + ' MiB':>12}{'over base':>11}{'s':>6}" for label, _ in pythons
    )
    print(head)
    print("-" * len(head))
    for name, *_ in SCENARIOS:
        row = f"{name:34}"
        for label, _ in pythons:
            peak, took = results[(label, name)]
            base = results[(label, SCENARIOS[0][0])][0]
            row += f"{peak:12.0f}{peak - base:11.0f}{took:6.1f}"
        print(row)
    print(
        f"(outputs: MCP {MCP_SIZE / 1e6:.0f} MB of structured text each, http.fetch {HTTP_SIZE >> 20} MiB "
        "of random bytes, base64 in the output)"
    )


if __name__ == "__main__":
    asyncio.run(main())
