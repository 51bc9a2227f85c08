"""Redis restarted under a steady load, then a burst of requests of every kind right after every
service's `/readyz` is 200 again (issue 38, items 1 and 4). Used by `test_redis_outage.py` and
`bench/redis_restart.py`.

The kinds each touch Redis in another service: `calls.get` and `calls.start` (dispatcher, a read
and a write), `runs.open` (dispatcher, a write), `approvals.list` (approval, a read) and
`runs.credentials.set` (credentials, a write). `calls.start` calls `o.ok`, an at_most_once tool
whose input `n` is unique: the MCP server seeing an `n` twice would be a command applied twice.
A burst of `WIDE` requests of each kind at a time before the outage leaves every service's pool
holding that many connections, most of them idle through the outage (the steady load sends
`CONCURRENCY` at a time); the burst after it sends `WIDE` at a time again, so it meets them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.system.faults.stack import Stack

KINDS = ("calls.get", "calls.start", "runs.open", "approvals.list", "runs.credentials.set")
CONCURRENCY = 4
WIDE = 30
UNREACHABLE = "Redis unreachable"
BACK = "Redis reachable again"


@dataclass
class Tally:
    """Replies by kind and code (`ok`, an error code, or `noReply`)."""

    codes: dict[str, Counter[str]] = field(default_factory=lambda: {k: Counter() for k in KINDS})

    def unavailable(self, kind: str | None = None) -> int:
        return sum(c["unavailable"] for k, c in self.codes.items() if kind in (None, k))

    def failed(self) -> int:
        return sum(n for c in self.codes.values() for code, n in c.items() if code != "ok")


@dataclass
class LogCount:
    """What the services logged from an offset on: lines, outage warnings, recovery lines (with
    the counts of `unavailable` they report) and tracebacks, per service log."""

    unreachable: dict[str, int] = field(default_factory=dict)
    back: dict[str, int] = field(default_factory=dict)
    reported_unavailable: dict[str, int] = field(default_factory=dict)
    tracebacks: dict[str, int] = field(default_factory=dict)
    traceback_lines: int = 0
    lines: dict[str, int] = field(default_factory=dict)
    sample: list[str] = field(default_factory=list)


class Workload:
    """The requests of each kind, on one run (and a call of it to read) made at the start."""

    def __init__(self, stack: Stack, toolset: str) -> None:
        self.stack = stack
        self.toolset = toolset
        self.run_id = ""
        self.call_id = ""
        self._n = itertools.count(1_000_000 + uuid.uuid4().int % 1_000_000 * 1000)
        self.inputs: list[int] = []
        """The `n` of every `o.ok` call a `calls.start` was answered ok for."""

    async def prepare(self) -> None:
        s = self.stack
        self.run_id = (await s.persist(s.subjects.runs_open, {"toolsetId": self.toolset}))["runId"]
        started = await s.persist(
            s.subjects.calls_start,
            {"runId": self.run_id, "tool": "r.ok", "input": {"n": 0}, "idempotencyKey": uuid.uuid4().hex},
        )
        self.call_id = started["callId"]

    def body(self, kind: str) -> tuple[str, dict[str, Any], int | None]:
        s = self.stack.subjects
        if kind == "calls.get":
            return s.calls_get, {"callId": self.call_id}, None
        if kind == "calls.start":
            n = next(self._n)
            key = f"outage-{n}"
            return (
                s.calls_start,
                {"runId": self.run_id, "tool": "o.ok", "input": {"n": n}, "idempotencyKey": key},
                n,
            )
        if kind == "runs.open":
            return s.runs_open, {"toolsetId": self.toolset, "runId": f"run_{uuid.uuid4().hex}"}, None
        if kind == "approvals.list":
            return s.approvals_list, {"runId": self.run_id}, None
        headers = self.stack.auth_headers(uuid.uuid4().hex)
        return (
            s.runs_credentials_set,
            {"runId": self.run_id, "credentials": {"servers": {"c": {"headers": headers}}}},
            None,
        )

    async def one(self, kind: str, tally: Tally) -> None:
        subject, body, n = self.body(kind)
        try:
            reply = await self.stack.request(subject, body, timeout=10.0)
        except Exception:
            tally.codes[kind]["noReply"] += 1
            return
        code = "ok" if reply["ok"] else reply["error"]["code"]
        tally.codes[kind][code] += 1
        if code == "ok" and n is not None:
            self.inputs.append(n)

    async def burst(self, per_kind: int, tally: Tally) -> None:
        """`per_kind` requests of each kind, `WIDE` of each kind at a time, the kinds together."""

        async def kind_burst(kind: str) -> None:
            for start in range(0, per_kind, WIDE):
                await asyncio.gather(*(self.one(kind, tally) for _ in range(min(WIDE, per_kind - start))))

        await asyncio.gather(*(kind_burst(k) for k in KINDS))

    async def steady(self, stop: asyncio.Event, tally: Tally) -> None:
        """Requests of every kind, `CONCURRENCY` at a time each, until `stop`."""

        async def kind_loop(kind: str) -> None:
            while not stop.is_set():
                await asyncio.gather(*(self.one(kind, tally) for _ in range(CONCURRENCY)))
                await asyncio.sleep(0.05)

        await asyncio.gather(*(kind_loop(k) for k in KINDS))

    async def applied_twice(self, within: float = 60.0) -> int:
        """Inputs of `o.ok` the MCP server received more than once, once every started call has
        reached it (at_most_once: a call sends at most one request)."""
        assert self.stack.mcp is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        wanted = set(self.inputs)
        while True:
            seen = Counter(c.arguments.get("n") for c in self.stack.mcp.calls if c.tool == "ok")
            if wanted <= set(seen) or loop.time() > deadline:
                return sum(1 for n in wanted if seen[n] > 1)
            await asyncio.sleep(0.2)


async def all_ready(stack: Stack, within: float = 120.0) -> None:
    """Every service's `/readyz` answers 200."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    urls = [p.ready_url for procs in stack.services.values() for p in procs]
    async with httpx.AsyncClient(timeout=2.0) as http:
        while True:
            codes = []
            for url in urls:
                try:
                    codes.append((await http.get(url)).status_code)
                except httpx.HTTPError:
                    codes.append(0)
            if all(c == 200 for c in codes):
                return
            if loop.time() > deadline:
                raise AssertionError(f"/readyz not 200 within {within}s: {codes}")
            await asyncio.sleep(0.05)


def log_offsets(stack: Stack) -> dict[Path, int]:
    return {p.log_path: p.log_path.stat().st_size for procs in stack.services.values() for p in procs}


async def logs_once_back(offsets: dict[Path, int], within: float = 30.0) -> LogCount:
    """The logs from `offsets` on, read once every service that logged Redis unreachable has
    logged it back (its probe's next period), or after `within` s; then two seconds more, for a
    second line that should not be there."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        count = count_logs(offsets)
        if count.unreachable and set(count.unreachable) <= set(count.back):
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(2.0)
    return count_logs(offsets)


def count_logs(offsets: dict[Path, int]) -> LogCount:
    count = LogCount()
    for path, offset in offsets.items():
        name = path.parent.name
        with path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
        lines = [line for line in text.splitlines() if line.strip()]
        count.lines[name] = len(lines)
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:  # a line not written by the services' logging
                record = {"event": line}
            event = str(record.get("event", ""))
            if event.startswith(UNREACHABLE):
                count.unreachable[name] = count.unreachable.get(name, 0) + 1
            if event.startswith(BACK):
                count.back[name] = count.back.get(name, 0) + 1
                count.reported_unavailable[name] = int(record.get("unavailableReplies", 0))
            exc = record.get("exc") or ("Traceback" in line and line)
            if exc:
                count.tracebacks[name] = count.tracebacks.get(name, 0) + 1
                count.traceback_lines += len(str(exc).splitlines())
                if len(count.sample) < 3:
                    count.sample.append(line[:600])
    return count


@dataclass
class Outcome:
    during: Tally
    after: Tally
    applied_twice: int
    logs: LogCount
    ready_seconds: float


async def restart_under_load(stack: Stack, toolset: str, *, down: float, per_kind: int = 300) -> Outcome:
    """The steady load for a second, Redis stopped for `down` s and started again, the load
    stopped once every `/readyz` is 200, then `per_kind` requests of each kind at once."""
    work = Workload(stack, toolset)
    await work.prepare()
    await all_ready(stack)
    await work.burst(WIDE * 2, Tally())  # pools of WIDE connections, idle once it is done
    offsets = log_offsets(stack)
    during = Tally()
    stop = asyncio.Event()
    load = asyncio.create_task(work.steady(stop, during))
    await asyncio.sleep(1.0)
    await stack.restart_redis(down=down)
    loop = asyncio.get_running_loop()
    back = loop.time()
    await all_ready(stack)
    ready_seconds = loop.time() - back
    stop.set()
    await load
    after = Tally()
    await work.burst(per_kind, after)
    twice = await work.applied_twice()
    return Outcome(during, after, twice, await logs_once_back(offsets), ready_seconds)
