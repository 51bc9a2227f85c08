"""`make bench`: every figure of toolbus's cost in one table, each beside a baseline measured in the
same run and the ratio, with the commit it ran on.

    uv run python bench/table.py [--calls 1000] [--json out.json | --json -] [--only SECTION ...]
    uv run python bench/table.py --calls 10      # the short run (10 calls per figure)

Sections: the call through the dispatcher vs the same MCP call direct (one and two dispatcher
processes), internal commands (`bench/internal.py`), the transport (`bench/transport.py`),
registration of a 1,000-tool toolset, search (`bench/search.py`) and declarations over 10,000
tools, credential resolution, the Redis semaphore, and the RSS of each service idle and after
10,000 calls. Benches other engineers own are called when they exist: a module that defines
`table_figures(calls: int) -> list[Figure]` (sync or async) gives its rows; one that does not is
run as a script and its output kept in the JSON; one that is missing leaves a row that says
"not measured yet". Numbers come from a shared 2-core machine: read the ratios, not the absolutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import credentials, declarations, dispatch, registry, semaphore
from bench.harness import Figure, commit, in_flight, not_measured, print_table, rss_mib
from bench.stack import SERVICES, BenchStack

SHORT = 100
"""Below this many calls per figure the run is a short one (sizes kept, repetitions cut)."""
outputs: dict[str, str] = {}
"""Raw output of benches run as scripts, by file name (kept in the JSON)."""


# ---- benches owned elsewhere ------------------------------------------------------------------------


async def owned_elsewhere(
    module: str, issue: str, section: str, rows: list[tuple[str, str]], calls: int, args: list[str],
    parse: Callable[[str], list[Figure]],
) -> list[Figure]:  # fmt: skip
    """Rows of `bench/<module>.py`: from its `table_figures(calls)` if it has one, else from its
    printed output (`parse`); "not measured yet" rows when it is missing or its output changed."""
    path = ROOT / "bench" / f"{module}.py"
    if not path.exists():
        why = f"bench/{module}.py ({issue}) is not on this commit"
        return [not_measured(section, name, unit, why) for name, unit in rows]
    mod = importlib.import_module(f"bench.{module}")
    hook = getattr(mod, "table_figures", None)
    if hook is not None:
        got = hook(calls)
        return list(await got) if inspect.isawaitable(got) else list(got)
    if calls < SHORT:
        why = f"skipped in a short run: bench/{module}.py has no short mode cheap enough for the tests"
        return [not_measured(section, name, unit, why) for name, unit in rows]
    figures = parse(await run_script(module, args))
    if not figures:
        why = f"bench/{module}.py ran but its output was not understood (kept under outputs in --json)"
        return [not_measured(section, name, unit, why) for name, unit in rows]
    return figures


async def run_script(module: str, args: list[str]) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "bench" / f"{module}.py"),
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    outputs[f"bench/{module}.py {' '.join(args)}".strip()] = text
    return text


def parse_internal(out: str) -> list[Figure]:
    """`bench/internal.py`'s rows (`what  n  p50  p99  max`, ms) beside its bare NATS baseline."""
    rows = [
        (m.group(1).strip(), float(m.group(3)), float(m.group(4)))
        for m in re.finditer(r"^(\S.*?)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", out, re.M)
    ]
    base = next((r for r in rows if r[0].startswith("baseline")), None)
    if base is None:
        return []
    figures = []
    for name, p50, p99 in rows:
        if name != base[0]:
            figures.append(
                Figure("internal commands", f"{name}: p50", p50, "ms", "bare NATS request/reply p50", base[1])
            )
            figures.append(
                Figure("internal commands", f"{name}: p99", p99, "ms", "bare NATS request/reply p99", base[2])
            )
    return figures


def parse_transport(out: str) -> list[Figure]:
    """`bench/transport.py`'s rows (`server side  p50  p99  p50 over raw`, µs); the first is raw."""
    rows = [
        (m.group(1).strip(), float(m.group(2)), float(m.group(3)))
        for m in re.finditer(r"^(\S.*?)\s+(\d+)\s+(\d+)\s+[+-]\d+\s*$", out, re.M)
    ]
    if len(rows) < 2:
        return []
    (base, b50, b99), figures = rows[0], []
    for name, p50, p99 in rows[1:]:
        figures.append(
            Figure("transport", f"request/reply served by {name}: p50", p50, "µs", f"{base} p50", b50)
        )
        figures.append(
            Figure("transport", f"request/reply served by {name}: p99", p99, "µs", f"{base} p99", b99)
        )
    return figures


async def internal(calls: int) -> list[Figure]:
    return await owned_elsewhere(
        "internal",
        "issue 10",
        "internal commands",
        [
            ("approvals.decide -> the call proceeds: p50", "ms"),
            ("credentials set -> parked call resumes: p50", "ms"),
            ("runs.close -> applied: p50", "ms"),
        ],
        calls,
        ["--samples", "60"],
        parse_internal,
    )


async def transport(calls: int) -> list[Figure]:
    return await owned_elsewhere(
        "transport",
        "issue 10",
        "transport",
        [("request/reply served by FastStream vs raw nats-py: p50", "µs")],
        calls,
        ["--requests", "3000", "--rounds", "3"],
        parse_transport,
    )


async def search(calls: int) -> list[Figure]:
    """`bench/search.py` (issue 15) run as a script with `--json`: each labelled corpus through a
    registry over NATS beside plain BM25 over the same texts in the same run. It has no short run
    (minutes on 2 cores), so a short table leaves its rows "not measured"."""
    section = "search"
    names = [
        ("top-1", "", "plain BM25 top-1"),
        ("recall@5", "", "plain BM25 recall@5"),
        ("p50 through NATS", "ms", "plain BM25 p50 (in-process)"),
        ("p99 through NATS", "ms", "plain BM25 p99 (in-process)"),
        ("first search after registration", "ms", ""),
    ]
    corpora = ("small", "large")
    if not (ROOT / "bench" / "search.py").exists():
        why = "bench/search.py (issue 15) is not on this commit"
        return [not_measured(section, f"{c}: {n}", u, why) for c in corpora for n, u, _ in names]
    if calls < SHORT:
        why = "skipped in a short run: bench/search.py has no short mode (minutes on 2 cores)"
        return [not_measured(section, f"{c}: {n}", u, why) for c in corpora for n, u, _ in names]
    out = await run_script("search", ["--rounds", "1", "--json"])
    results: list[dict[str, Any]] = []
    for line in out.splitlines():
        if line.startswith("[{"):
            with contextlib.suppress(ValueError):
                results = json.loads(line)
    if not results:
        why = "bench/search.py ran but printed no --json result (see its output)"
        return [not_measured(section, f"{c}: {n}", u, why) for c in corpora for n, u, _ in names]
    figures = []
    for r in results:
        label = f"{r['corpus']} ({r['tools']:,} tools)"
        # The labelled task as the query (bench/search.py's `task` set): BM25's latencies are over
        # those tasks too, its accuracy is per set.
        tb, bm = r["toolbus"]["task"], {**r["bm25"], **r["bm25"]["task"]}
        rows = [
            (tb["top1"], bm["top1"]),
            (tb["recall5"], bm["recall5"]),
            (tb["p50"] * 1000, bm["p50"] * 1000),
            (tb["p99"] * 1000, bm["p99"] * 1000),
            (r["cold"]["first_search"] * 1000, None),
        ]
        for (name, unit, base), (value, baseline) in zip(names, rows, strict=True):
            note = "" if base else "no baseline in bench/search.py"
            figures.append(Figure(section, f"{label}: {name}", value, unit, base, baseline, note))
    return figures


# ---- the stack: calls through the dispatcher, and memory ------------------------------------------


def floor_rss() -> float:
    """RSS of a Python process that imported what every service imports (nats-py, redis-py,
    pydantic, the contracts): the floor under a service's own memory."""
    code = (
        "import nats, redis.asyncio, pydantic, orjson, toolbus_contracts, toolbus_common, sys;"
        "print(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()) / 1024


async def stack_figures(calls: int) -> list[Figure]:
    """Dispatch figures, then RSS of each service idle and after `calls_for_rss` more calls."""
    rss_calls = 10_000 if calls >= SHORT else calls
    searches = max(1, rss_calls // 10)
    async with BenchStack() as stack:
        floor = floor_rss()
        idle = stack.idle_rss
        registered = {name: rss_mib(pid) for name, pid in stack.pids().items()}
        figures = await dispatch.measure(stack, calls, 2 if calls >= SHORT else 1, warmup=min(calls, 200))
        await in_flight(stack.invoke, rss_calls)
        body = orjson.dumps({"id": stack.toolset_id, "query": "echo the text back", "limit": 5})

        async def search() -> object:
            return await stack.ok(stack.subjects.toolsets_search, body)

        await in_flight(search, searches)
        after = {name: rss_mib(pid) for name, pid in stack.pids().items()}
    section = "memory (RSS)"
    figures += [
        Figure(section, f"{name} idle", idle[name], "MiB", "python + nats/redis/pydantic imported", floor)
        for name in SERVICES
    ]
    figures.append(
        Figure(
            section,
            "registry once the echo toolset is registered",
            registered["registry"],
            "MiB",
            "registry idle",
            idle["registry"],
        )
    )
    load = f"{rss_calls:,} more calls.invoke + {searches:,} toolsets.search"
    figures += [
        Figure(section, f"{name} after {load}", after[name], "MiB", f"{name} idle", idle[name])
        for name in SERVICES
    ]
    figures.append(
        Figure(section, "all four services idle", sum(idle.values()), "MiB", "4 x the floor", 4 * floor)
    )
    figures.append(
        Figure(
            section,
            f"all four services after {load}",
            sum(after.values()),
            "MiB",
            "all four idle",
            sum(idle.values()),
        )
    )
    return figures


# ---- the table -------------------------------------------------------------------------------------

Section = Callable[[int], Awaitable[list[Figure]]]


async def _registration(calls: int) -> list[Figure]:
    if calls >= SHORT:
        return await registry.measure(10)
    return await registry.measure(1, servers=1, tools=1000)  # the short run: one process to start


async def _declarations(calls: int) -> list[Figure]:
    if calls >= SHORT:
        return await asyncio.to_thread(declarations.measure, 10_000, 2)
    return await asyncio.to_thread(declarations.measure, 1_000, 1)  # the short run


async def _credentials(calls: int) -> list[Figure]:
    return await credentials.measure(max(calls, 10) * 3)


async def _semaphore(calls: int) -> list[Figure]:
    return await semaphore.measure(max(calls, 10) * 3)


SECTIONS: dict[str, Section] = {
    "dispatch": stack_figures,
    "internal": internal,
    "transport": transport,
    "registration": _registration,
    "search": search,
    "declarations": _declarations,
    "credentials": _credentials,
    "semaphore": _semaphore,
}


async def run(calls: int, only: list[str]) -> dict[str, object]:
    import time

    figures: list[Figure] = []
    seconds: dict[str, float] = {}
    chosen = [(name, section) for name, section in SECTIONS.items() if not only or name in only]

    async def timed(name: str, section: Section) -> list[Figure]:
        start = time.perf_counter()
        got = await section(calls)
        seconds[name] = round(time.perf_counter() - start, 1)
        return got

    for name, section in chosen:  # one at a time, so no section's load lands on another's figures
        figures += await timed(name, section)
    return {
        **commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "calls_per_figure": calls,
        "short": calls < SHORT,
        "figures": [f.as_json() for f in figures],
        "seconds": seconds,
        "outputs": outputs,
        "_figures": figures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per latency figure (10: a short run)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON (- for stdout only)")
    parser.add_argument(
        "--only", nargs="*", default=[], choices=list(SECTIONS), help="run only these sections"
    )
    args = parser.parse_args()
    import uvloop

    result = uvloop.run(run(args.calls, args.only))
    figures = result.pop("_figures")
    assert isinstance(figures, list)
    data = orjson.dumps(result, option=orjson.OPT_INDENT_2)
    if args.json == "-":
        sys.stdout.buffer.write(data + b"\n")
        return
    dirty = " (work tree differs from it)" if result["dirty"] else ""
    print_table(
        figures,
        f"toolbus bench on commit {result['commit']}{dirty}: {result['subject']}\n"
        f"{result['date']}, {result['cpus']} CPUs, {args.calls} calls per latency figure"
        f"{' (short run)' if result['short'] else ''}; ratio = value / baseline (same run)",
    )
    if args.json:
        Path(args.json).write_bytes(data)
        print(f"\nJSON written to {args.json}")


if __name__ == "__main__":
    main()
