"""A whole toolbus for fault tests, owned by the test: its own `nats-server` (JetStream on disk) and
`redis-server` (append-only file) on free ports, the four services as processes, and a real MCP
server over streamable HTTP whose tools answer, fail, take their time or hang. Servers can be
restarted on the same port with their data; services can be killed with SIGKILL and restarted.

`Load` starts runs x calls with `calls.start` (retrying, with the same idempotency key, whatever
got no answer: that is what a client does), and `check()` proves, after the fact, the invariants
of the fault suite: every accepted call has exactly one outcome; the stream's events agree with
calls.get, each once; retry calls carry one key to the server (an idempotent server applies each
once); an at_most_once call reached the server at most once; no slot, lease, queue place or outbox
entry is left; no outcome is `internal`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcp_types as types
import nats
from cryptography.fernet import Fernet
from nats.aio.client import Client as NatsClient
from redis.asyncio import Redis
from toolbus_common.keys import Keys
from toolbus_contracts import Subjects
from toolbus_devstack import (
    LocalServer,
    ServiceProcess,
    free_port,
    launch_service,
    start_nats_server,
    start_redis_server,
    stop_process,
    wait_ready,
)

from tests.support.infra import js_name
from tests.support.mcp_servers import McpTestServer

PREFIX = "tbf"
LEASE = 2.0
SERVICES = ("registry", "credentials", "approval", "dispatcher")

TOOL_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}
TOOLS = [{"name": n, "description": n, "inputSchema": TOOL_SCHEMA} for n in ("ok", "fail", "slow", "hang")]


async def tool_handler(name: str, arguments: dict[str, Any]) -> Any:
    if name == "fail":
        return types.CallToolResult(content=[types.TextContent(text="failed on purpose")], is_error=True)
    if name == "slow":
        await asyncio.sleep(random.uniform(0.2, 0.8))
    if name == "hang":
        await asyncio.sleep(30)  # past every timeout; the server stops it at teardown
    return {"n": arguments.get("n", 0)}


# (qualified tool, policy kind, weight): what the load calls.
MIX = [
    ("r.ok", "retry", 50),
    ("o.ok", "at_most_once", 15),
    ("r.fail", "retry", 10),
    ("r.slow", "retry", 10),
    ("o.slow", "at_most_once", 8),
    ("r.hang", "retry", 4),
    ("o.hang", "at_most_once", 3),
]


@dataclass
class Stack:
    base: Path
    nats: LocalServer | None = None
    redis: LocalServer | None = None
    nats_port: int = 0
    redis_port: int = 0
    mcp: McpTestServer | None = None
    services: dict[str, list[ServiceProcess]] = field(default_factory=dict)
    secret: str = field(default_factory=lambda: Fernet.generate_key().decode())
    subjects: Subjects = field(default_factory=lambda: Subjects(PREFIX))
    keys: Keys = field(default_factory=lambda: Keys(PREFIX))
    nc: NatsClient | None = None
    redis_client: Any = None

    # ---- servers ----------------------------------------------------------------------------
    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def start_nats(self) -> None:
        self.nats_port = self.nats_port or free_port()
        self.nats = start_nats_server(self.nats_port, self.base / "nats", self.base / "nats.log")

    def start_redis(self) -> None:
        self.redis_port = self.redis_port or free_port()
        self.redis = start_redis_server(
            self.redis_port, self.base / "redis", self.base / "redis.log", persist=True
        )

    async def restart_nats(self, down: float = 1.0) -> None:
        """SIGTERM (JetStream state on disk survives), a pause with no NATS, start on the port."""
        assert self.nats is not None
        await asyncio.to_thread(self.nats.stop)
        await asyncio.sleep(down)
        await asyncio.to_thread(self.start_nats)

    async def restart_redis(self, down: float = 1.0) -> None:
        """SIGTERM (the append-only file is flushed), a pause with no Redis, start on the port."""
        assert self.redis is not None
        await asyncio.to_thread(self.redis.stop)
        await asyncio.sleep(down)
        await asyncio.to_thread(self.start_redis)

    # ---- services ----------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        return {
            "TOOLBUS_NATS_URL": self.nats_url,
            "TOOLBUS_REDIS_URL": self.redis_url,
            "TOOLBUS_SUBJECT_PREFIX": PREFIX,
            "TOOLBUS_SECRET_KEY": self.secret,
            "TOOLBUS_DISPATCHER_LEASE": str(LEASE),
            "TOOLBUS_DISPATCHER_RETRY_BACKOFF": "0.05",
            "TOOLBUS_DISPATCHER_RETRY_BACKOFF_MAX": "0.2",
            "TOOLBUS_LOG_LEVEL": "WARNING",
        }

    async def start_service(self, name: str) -> ServiceProcess:
        service = launch_service(name, self.env(), log_dir=self.base)
        await asyncio.to_thread(
            wait_ready, service.ready_url, service.proc, service.log_path, what=name, timeout=90
        )
        self.services.setdefault(name, []).append(service)
        return service

    async def kill(self, service: ServiceProcess) -> None:
        await asyncio.to_thread(service.kill)
        self.services[service.name].remove(service)

    async def stop(self) -> None:
        for procs in self.services.values():
            for service in procs:
                await asyncio.to_thread(stop_process, service.proc, 5.0)
        self.services.clear()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
        if self.redis_client is not None:
            with contextlib.suppress(Exception):
                await self.redis_client.aclose()
        if self.mcp is not None:
            await self.mcp.stop()
        for server in (self.nats, self.redis):
            if server is not None:
                await asyncio.to_thread(server.stop)

    # ---- client ------------------------------------------------------------------------------
    async def connect(self) -> None:
        self.nc = await nats.connect(self.nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        self.redis_client = Redis.from_url(self.redis_url)

    async def request(self, subject: str, body: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        assert self.nc is not None
        msg = await self.nc.request(subject, json.dumps(body).encode(), timeout=timeout)
        reply: dict[str, Any] = json.loads(msg.data)
        return reply

    async def ok(self, subject: str, body: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        reply = await self.request(subject, body, timeout)
        assert reply["ok"], reply
        data: dict[str, Any] = reply["data"]
        return data

    async def persist(self, subject: str, body: dict[str, Any], within: float = 60.0) -> dict[str, Any]:
        """A request sent again until it is answered `ok` (through outages: the client's job).
        Any error other than `unavailable` (or no answer) fails the test at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            try:
                reply = await self.request(subject, body, timeout=3.0)
            except Exception:  # no answer (NATS away, a service restarting): send again
                reply = None
            if reply is not None:
                if reply["ok"]:
                    data: dict[str, Any] = reply["data"]
                    return data
                assert reply["error"]["code"] == "unavailable", reply
            if loop.time() > deadline:
                raise AssertionError(f"{subject} never answered ok within {within}s")
            await asyncio.sleep(0.1)

    async def toolset(self) -> str:
        assert self.mcp is not None
        spec = {
            "mcp": [
                {"name": "r", "url": self.mcp.url, "policies": {"hang": {"timeout": "400ms"}}},
                {
                    "name": "o",
                    "url": self.mcp.url,
                    "policies": {
                        n: {"onInterruption": "at_most_once", **({"timeout": "400ms"} if n == "hang" else {})}
                        for n in ("ok", "fail", "slow", "hang")
                    },
                },
            ]
        }
        data = await self.persist(self.subjects.toolsets_create, spec)
        toolset_id: str = data["id"]
        return toolset_id


async def open_stack(*, dispatchers: int = 1) -> Stack:
    stack = Stack(Path(tempfile.mkdtemp(prefix="toolbus-faults-")))
    try:
        await asyncio.to_thread(stack.start_nats)
        await asyncio.to_thread(stack.start_redis)
        stack.mcp = await McpTestServer(TOOLS, tool_handler, name="faults").start()
        for name in SERVICES[:-1]:
            await stack.start_service(name)
        for _ in range(dispatchers):
            await stack.start_service("dispatcher")
        await stack.connect()
    except BaseException:
        await stack.stop()
        raise
    return stack


# ---- the load and its checks ---------------------------------------------------------------------


@dataclass
class Call:
    run_id: str
    tool: str
    policy: str
    key: str
    call_id: str = ""


@dataclass
class Result:
    scenario: str
    calls: int
    outcomes: Counter[str]
    duplicates: int
    events_agree: int
    leftovers: int
    deliveries: int

    def row(self) -> str:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))
        return (
            f"| {self.scenario} | {self.calls} | {outcomes} | {self.duplicates} | "
            f"{self.events_agree}/{self.calls} | {self.leftovers} |"
        )


class Load:
    """`runs` x `per_run` calls, weighted by `MIX`, started with `calls.start` (in flight at once
    up to `spread`)."""

    def __init__(self, stack: Stack, toolset_id: str, *, runs: int, per_run: int, seed: int = 7) -> None:
        self.stack = stack
        self.toolset_id = toolset_id
        self.runs = runs
        self.per_run = per_run
        self.rng = random.Random(seed)
        self.calls: list[Call] = []
        self.run_ids: list[str] = []

    async def start(self, spread: int = 32) -> None:
        tools = [t for t, _, w in MIX for _ in range(w)]
        policy = {t: p for t, p, _ in MIX}
        for _ in range(self.runs):
            data = await self.stack.persist(self.stack.subjects.runs_open, {"toolsetId": self.toolset_id})
            self.run_ids.append(data["runId"])
        for run_id in self.run_ids:
            for i in range(self.per_run):
                tool = self.rng.choice(tools)
                self.calls.append(Call(run_id, tool, policy[tool], f"{run_id}-{i}"))
        self.rng.shuffle(self.calls)
        gate = asyncio.Semaphore(spread)

        async def one(call: Call) -> None:
            async with gate:
                body = {
                    "runId": call.run_id,
                    "tool": call.tool,
                    "input": {"n": 1},
                    "idempotencyKey": call.key,
                }
                data = await self.stack.persist(self.stack.subjects.calls_start, body)
                call.call_id = data["callId"]

        await asyncio.gather(*(one(c) for c in self.calls))

    async def settle(self, within: float = 120.0) -> dict[str, dict[str, Any]]:
        """calls.get of every call once all are done (polling through outages)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        done: dict[str, dict[str, Any]] = {}
        while True:
            pending = [c for c in self.calls if c.call_id not in done]
            gets = await asyncio.gather(
                *(self.stack.persist(self.stack.subjects.calls_get, {"callId": c.call_id}) for c in pending)
            )
            for call, got in zip(pending, gets, strict=True):
                if got["state"] == "done":
                    done[call.call_id] = got
            if len(done) == len(self.calls):
                return done
            if loop.time() > deadline:
                states = Counter(g["state"] for g in gets)
                raise AssertionError(f"calls never finished: {states}")
            await asyncio.sleep(0.2)


async def stream_events(stack: Stack, run_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Every event in the EVENTS stream of these runs, by callId, in stream order."""
    assert stack.nc is not None
    js = stack.nc.jetstream()
    by_call: dict[str, list[dict[str, Any]]] = {}
    for run_id in run_ids:
        sub = await js.subscribe(
            stack.subjects.run_events(run_id), stream=js_name(PREFIX, "EVENTS"), ordered_consumer=True
        )
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=2)
                except (TimeoutError, nats.errors.TimeoutError):
                    break
                event = json.loads(msg.data)
                by_call.setdefault(event["callId"], []).append(event)
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
    return by_call


async def leftovers(stack: Stack, run_ids: list[str], call_ids: list[str]) -> int:
    """Slots, tool slots, queue places, leases of these calls, and outbox entries still there."""
    r = Redis.from_url(stack.redis_url)  # a fresh connection: Redis may have restarted under the old one
    try:
        return await _leftovers(r, stack.keys, run_ids, call_ids)
    finally:
        await r.aclose()  # type: ignore[attr-defined]


async def _leftovers(r: Any, k: Keys, run_ids: list[str], call_ids: list[str]) -> int:
    count = 0
    for run_id in run_ids:
        count += await r.zcard(k.run_slots(run_id))
        count += await r.zcard(k.run_waiting(run_id))
        for tool in {t for t, _, _ in MIX}:
            count += await r.zcard(k.run_tool_slots(run_id, tool))
    ids = set(call_ids)
    count += sum(1 for m in await r.zrange(k.call_leases, 0, -1) if m.decode() in ids)
    count += await r.xlen(k.call_events_outbox)
    return count


async def check(stack: Stack, load: Load, scenario: str) -> Result:
    """Every invariant of the fault suite, asserted; the table row of the scenario."""
    done = await load.settle()
    assert len({c.call_id for c in load.calls}) == len(load.calls), "a key gave two calls"
    outcomes: Counter[str] = Counter()
    for call in load.calls:
        outcome = done[call.call_id]["outcome"]
        assert outcome is not None
        code = "ok" if outcome["status"] == "ok" else outcome["error"]["code"]
        outcomes[code] += 1
        assert code != "internal", (call, outcome)
    # the relay catches up: the stream then holds every call's events
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        events = await stream_events(stack, load.run_ids)
        complete = all(any(e["type"] == "completed" for e in events.get(c.call_id, [])) for c in load.calls)
        if complete or loop.time() > deadline:
            break
        await asyncio.sleep(0.5)
    agree = 0
    for call in load.calls:
        got = done[call.call_id]
        evs = events.get(call.call_id, [])
        kinds = Counter(e["type"] for e in evs)
        completed = [e for e in evs if e["type"] == "completed"]
        assert kinds["accepted"] == 1, (call, evs)
        assert kinds["completed"] == 1, (call, evs)
        assert completed[0]["outcome"] == got["outcome"], (call, completed, got)
        attempts = sorted(e["attempt"] for e in evs if e["type"] == "attemptStarted")
        assert attempts == list(range(1, got["attempts"] + 1)), (call, attempts, got)
        agree += 1
    # the server's view: one key per call; at_most_once at most once
    assert stack.mcp is not None
    seen = Counter(c.idempotency_key_header for c in stack.mcp.calls)
    assert all(c.idempotency_key_header == c.idempotency_key_meta for c in stack.mcp.calls)
    duplicates = 0
    for call in load.calls:
        if call.policy == "at_most_once":
            assert seen[call.key] <= 1, (call, seen[call.key])
        else:
            duplicates += max(0, seen[call.key] - 1)  # re-sent with the same key: applied once
    left = 0
    deadline = loop.time() + 30
    while True:
        left = await leftovers(stack, load.run_ids, [c.call_id for c in load.calls])
        if left == 0 or loop.time() > deadline:
            break
        await asyncio.sleep(0.2)
    assert left == 0, f"{left} slots/leases/queue places/outbox entries left"
    return Result(scenario, len(load.calls), outcomes, duplicates, agree, left, len(stack.mcp.calls))
