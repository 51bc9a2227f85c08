"""What the benches share: MCP test servers in their own processes, and timing loops that
return latencies, calls/s and this process's CPU per call."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
Call = Callable[[], Awaitable[object]]
Row = tuple[list[float], float, float]
"""Latencies (s), calls/s, and this process's CPU seconds per call."""


def start_mcp_server(tools: int = 0, prefix: str = "op") -> tuple[subprocess.Popen[str], str]:
    """An MCP test server (echo tools and `tools` synthetic ones) in a subprocess, so serving does
    not share the bench's GIL; returns the process and its URL."""
    return start_mcp_servers([(tools, prefix)])[0]


def start_mcp_servers(specs: list[tuple[int, str]]) -> list[tuple[subprocess.Popen[str], str]]:
    """`start_mcp_server` for each (tools, prefix), all starting at once."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.mcp_servers", "--tools", str(tools), "--prefix", prefix],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for tools, prefix in specs
    ]
    started = []
    for proc in procs:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http"):
            for p in procs:
                p.kill()
            raise SystemExit("an MCP test server did not start")
        started.append((proc, url))
    return started


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


# ---- the one table `make bench` prints ------------------------------------------------------------


@dataclass
class Figure:
    """One row of the table: a measured `value` beside the `baseline` measured in the same run.

    `value is None` means the figure was not measured (`note` says why): a row that is there and
    says so, never an invented number. `ratio` is value / baseline."""

    section: str
    name: str
    value: float | None
    unit: str
    baseline_name: str = ""
    baseline: float | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.value is None or self.baseline in (None, 0):
            return None
        assert self.baseline is not None
        return self.value / self.baseline

    def as_json(self) -> dict[str, object]:
        return {**asdict(self), "ratio": self.ratio}


def not_measured(section: str, name: str, unit: str, why: str) -> Figure:
    return Figure(section, name, None, unit, note=f"not measured yet: {why}")


def latency_figures(
    section: str, what: str, row: Row, base_name: str, base: Row, *, cpu: bool = False
) -> list[Figure]:
    """p50, p99 (ms) and calls/s of `row` beside the same figures of `base`."""
    lat, rate, cpu_per_call = row
    blat, brate, bcpu = base
    out = [
        Figure(
            section,
            f"{what} p50",
            percentile(lat, 0.5) * 1e3,
            "ms",
            f"{base_name} p50",
            percentile(blat, 0.5) * 1e3,
        ),
        Figure(
            section,
            f"{what} p99",
            percentile(lat, 0.99) * 1e3,
            "ms",
            f"{base_name} p99",
            percentile(blat, 0.99) * 1e3,
        ),
        Figure(section, f"{what} calls/s", rate, "1/s", f"{base_name} calls/s", brate),
    ]
    if cpu:
        out.append(
            Figure(
                section,
                f"{what} this process's CPU/call",
                cpu_per_call * 1e3,
                "ms",
                f"{base_name} CPU/call",
                bcpu * 1e3,
            )
        )
    return out


def merge(rows: list[Row]) -> Row:
    """Rounds of one path as one row: all latencies, the median rate and CPU per call."""
    import statistics

    return (
        [x for lat, _, _ in rows for x in lat],
        statistics.median(r for _, r, _ in rows),
        statistics.median(c for _, _, c in rows),
    )


def rss_mib(pid: int) -> float:
    """Resident set size of a process (`VmRSS`), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used so far (from /proc/<pid>/stat), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def commit() -> dict[str, object]:
    """The commit the bench runs on, and whether the work tree differs from it."""

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD") or "unknown",
        "subject": git("log", "-1", "--format=%s")[:100],
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "1/s":
        return f"{value:,.0f}/s"
    if unit == "MiB":
        return f"{value:.1f} MiB"
    digits = 3 if abs(value) < 10 else 1 if abs(value) < 1000 else 0
    return f"{value:,.{digits}f} {unit}"


def print_table(figures: list[Figure], header: str) -> None:
    print(header)
    width = max(len(f.name) for f in figures) + 2
    bwidth = max(len(f.baseline_name) for f in figures) + 2
    section = None
    for f in figures:
        if f.section != section:
            section = f.section
            print(f"\n[{section}]")
            print(f"{'figure':<{width}}{'value':>13}  {'baseline':<{bwidth}}{'value':>13}{'ratio':>8}")
        ratio = f"{f.ratio:.2f}x" if f.ratio is not None else ""
        line = (
            f"{f.name:<{width}}{_fmt(f.value, f.unit):>13}  {f.baseline_name:<{bwidth}}"
            f"{_fmt(f.baseline, f.unit) if f.baseline_name else '':>13}{ratio:>8}"
        )
        print(line.rstrip() + (f"  ({f.note})" if f.note else ""))
