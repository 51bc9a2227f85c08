"""What the benches share: MCP test servers in their own processes, and timing loops that
return latencies, calls/s and this process's CPU per call."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
Call = Callable[[], Awaitable[object]]
Row = tuple[list[float], float, float]
"""Latencies (s), calls/s, and this process's CPU seconds per call."""


def start_mcp_server(tools: int = 0, prefix: str = "op") -> tuple[subprocess.Popen[str], str]:
    """An MCP test server (echo tools and `tools` synthetic ones) in a subprocess, so serving does
    not share the bench's GIL; returns the process and its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.mcp_servers", "--tools", str(tools), "--prefix", prefix],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        proc.kill()
        raise SystemExit("the MCP test server did not start")
    return proc, url


def stop_processes(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(10)


async def sequential(call: Call, n: int) -> Row:
    latencies = []
    cpu = time.process_time()
    start = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        await call()
        latencies.append(time.perf_counter() - t)
    return latencies, n / (time.perf_counter() - start), (time.process_time() - cpu) / n


async def in_flight(call: Call, n: int, width: int = 16) -> Row:
    latencies: list[float] = []
    remaining = n

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            t = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - t)

    cpu = time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(width)))
    return latencies, n / (time.perf_counter() - start), (time.process_time() - cpu) / n


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]
