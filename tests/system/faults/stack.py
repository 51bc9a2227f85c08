"""A whole toolbus for fault tests, owned by the test: its own `nats-server` (JetStream on disk) and
`redis-server` (append-only file) on free ports, the four services as processes, and two real MCP
servers over streamable HTTP whose tools answer, fail, take their time or hang (the second wants a
bearer token, which each load rotates). Servers can be restarted on the same port with their data;
services can be killed with SIGKILL and restarted.

`Load` starts runs x calls with `calls.start` (retrying, with the same idempotency key, whatever
got no answer: that is what a client does). The mix has retry and at_most_once tools that answer,
fail, are slow or hang past their timeout, tools that need an approval (decided during the load by
an approver through `approvals.list` / `approvals.decide`: approved, or denied for every third),
and tools whose credentials are stale when the load starts (every such call gets a 401 and parks
until the load sets the new token through `toolsets.credentials.set`). So each service is on the
path of the load: the dispatcher runs calls, the approval service holds and decides approvals, the
credentials service parks and resumes calls, the registry answers `toolsets.create`/`toolsets.get`
(the dispatcher itself reads pinned toolsets from Redis, so calls do not wait for the registry).

`check()` proves, after the fact, the invariants of the fault suite: every accepted call has
exactly one outcome, and the expected one for approval and credentials calls; the stream's events
agree with calls.get, each once: one `accepted` first and one `completed` last (with the outcome
of calls.get) in the order their `Nats-Msg-Id` numbers give, `attemptStarted` numbered
1..attempts, and in that order in the stream too (`Result.disorder`, asserted by the scenarios); every request the
servers saw carries its call's key (header and `_meta` alike) and no call sent more requests than
it counted sends (attempts, plus one per park), so an idempotent server applies each retry call
once; an at_most_once call reached a server at most once; a denied call never reached one; no
slot, lease, queue place, parked entry, pending approval or outbox entry is left; no outcome is
`internal`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import tempfile
import time
import uuid
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


# (qualified tool, kind, weight): what the load calls. Server `r`: retry policy; `o`: at_most_once;
# `p`: retry, each call needs an approval; `c`: retry, behind a bearer token (credentials).
MIX = [
    ("r.ok", "retry", 44),
    ("o.ok", "at_most_once", 13),
    ("r.fail", "retry", 9),
    ("r.slow", "retry", 9),
    ("o.slow", "at_most_once", 7),
    ("r.hang", "retry", 4),
    ("o.hang", "at_most_once", 3),
    ("p.ok", "approval", 6),
    ("c.ok", "credentials", 6),
]
HANG = 0.4
"""The `hang` tools' timeout (s)."""


@dataclass
class Stack:
    base: Path
    nats: LocalServer | None = None
    redis: LocalServer | None = None
    nats_port: int = 0
    redis_port: int = 0
    mcp: McpTestServer | None = None
    mcp_auth: McpTestServer | None = None
    toolset_id: str = ""
    launched: int = 0
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
        # each process its own log (base/<name>-<n>/<name>.log): a restart keeps the killed one's
        self.launched += 1
        service = launch_service(name, self.env(), log_dir=self.base / f"{name}-{self.launched}")
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
        for mcp in (self.mcp, self.mcp_auth):
            if mcp is not None:
                await mcp.stop()
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

    async def persist(
        self, subject: str, body: dict[str, Any], within: float = 60.0, *, accept: str = ""
    ) -> dict[str, Any]:
        """A request sent again until it is answered `ok` (through outages: the client's job).
        Any error other than `unavailable` (or no answer) fails the test at once, except the
        code `accept` (a repeat of a request that went through before), whose error is returned."""
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
                if accept and reply["error"]["code"] == accept:
                    error: dict[str, Any] = reply["error"]
                    return error
                assert reply["error"]["code"] == "unavailable", reply
            if loop.time() > deadline:
                raise AssertionError(f"{subject} never answered ok within {within}s")
            await asyncio.sleep(0.1)

    def toolset_spec(self) -> dict[str, Any]:
        assert self.mcp is not None and self.mcp_auth is not None and self.mcp_auth.required_token
        hang = {"timeout": f"{int(HANG * 1000)}ms"}
        return {
            "mcp": [
                {"name": "r", "url": self.mcp.url, "policies": {"hang": hang}},
                {
                    "name": "o",
                    "url": self.mcp.url,
                    "policies": {
                        n: {"onInterruption": "at_most_once", **(hang if n == "hang" else {})}
                        for n in ("ok", "fail", "slow", "hang")
                    },
                },
                {"name": "p", "url": self.mcp.url, "policies": {"ok": {"approval": True}}},
                {"name": "c", "url": self.mcp_auth.url},
            ],
            "credentials": {"servers": {"c": {"headers": self.auth_headers(self.mcp_auth.required_token)}}},
        }

    @staticmethod
    def auth_headers(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    async def toolset(self) -> str:
        data = await self.persist(self.subjects.toolsets_create, self.toolset_spec())
        self.toolset_id = data["id"]
        return self.toolset_id

    def server_calls(self) -> list[Any]:
        """Every tools/call both MCP servers received (401s included), in no particular order."""
        assert self.mcp is not None and self.mcp_auth is not None
        return list(self.mcp.calls) + list(self.mcp_auth.calls)


async def open_stack(*, dispatchers: int = 1) -> Stack:
    stack = Stack(Path(tempfile.mkdtemp(prefix="toolbus-faults-")))
    try:
        await asyncio.to_thread(stack.start_nats)
        await asyncio.to_thread(stack.start_redis)
        stack.mcp = await McpTestServer(TOOLS, tool_handler, name="faults").start()
        stack.mcp_auth = await McpTestServer(
            TOOLS, tool_handler, name="faults-auth", required_token=f"tok-{uuid.uuid4().hex}"
        ).start()
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
    kind: str
    key: str
    n: int
    """The call's input `n`: unique in its load, and what the approver decides on."""
    call_id: str = ""

    @property
    def denied(self) -> bool:
        """An approval call the approver denies (every third)."""
        return self.kind == "approval" and self.n % 3 == 0


@dataclass
class Result:
    scenario: str
    calls: int
    outcomes: Counter[str]
    retry_resent: int
    """Requests of retry calls beyond each call's first, all with the call's key (an idempotent
    server applies each call once): a `hang` attempt that timed out, an attempt cut by a fault."""
    retry_resent_hang: int
    at_most_once_twice: int
    events_agree: int
    slots: int
    leases: int
    other_left: int
    approvals: Counter[str]
    parked: int
    seconds: float
    problems: list[str] = field(default_factory=list)
    disorder: list[str] = field(default_factory=list)
    """Calls whose events are all there once, agreeing with calls.get, but not in the call's
    order (`n` of their message ids) in the stream."""

    def row(self) -> str:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))
        approvals = ", ".join(f"{k} {v}" for k, v in sorted(self.approvals.items())) or "-"
        flag = "" if not self.problems else f" **FAILED: {len(self.problems)} problem(s)**"
        return (
            f"| {self.scenario}{flag} | {self.calls} | {outcomes} | "
            f"{self.retry_resent} ({self.retry_resent_hang} hang) / {self.at_most_once_twice} | "
            f"{self.events_agree}/{self.calls} | {len(self.disorder)} | {self.slots}/{self.leases}/{self.other_left} | "
            f"{approvals}; {self.parked} parked | {self.seconds:.1f} s |"
        )


TABLE_HEADER = (
    "| scenario | calls accepted | outcomes | duplicates: retry re-sent, same key (of which hang "
    "timeouts) / at_most_once twice | events agreeing with calls.get | calls with events out of "
    "stream order | leftovers: slots/leases/other | approvals decided; calls parked for credentials "
    "| time |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


class Load:
    """`runs` x `per_run` calls, weighted by `MIX`, started with `calls.start` (in flight at once
    up to `spread`), with an approver and a credentials setter running alongside: the token of
    server `c` is rotated when the load starts, and set again for the toolset `creds_after`
    seconds later (so calls to `c` started before then park and are resumed)."""

    def __init__(
        self,
        stack: Stack,
        toolset_id: str,
        *,
        runs: int,
        per_run: int,
        seed: int = 7,
        creds_after: float = 1.0,
    ) -> None:
        self.stack = stack
        self.toolset_id = toolset_id
        self.runs = runs
        self.per_run = per_run
        self.rng = random.Random(seed)
        self.creds_after = creds_after
        self.calls: list[Call] = []
        self.run_ids: list[str] = []
        self.decided: dict[str, bool] = {}
        """approval id -> approved, for each approval of this load's calls the approver decided."""
        self.began = time.monotonic()
        self._helpers: list[asyncio.Task[None]] = []

    async def start(self, spread: int = 32) -> None:
        assert self.stack.mcp_auth is not None
        token = f"tok-{uuid.uuid4().hex}"
        self.stack.mcp_auth.required_token = token  # the toolset's stored token is stale from now
        self._helpers = [
            asyncio.create_task(self._approver(), name="approver"),
            asyncio.create_task(self._set_credentials(token), name="credentials-setter"),
        ]
        tools = [t for t, _, w in MIX for _ in range(w)]
        kind = {t: k for t, k, _ in MIX}
        for _ in range(self.runs):
            data = await self.stack.persist(self.stack.subjects.runs_open, {"toolsetId": self.toolset_id})
            self.run_ids.append(data["runId"])
        for run_id in self.run_ids:
            for i in range(self.per_run):
                tool = self.rng.choice(tools)
                n = len(self.calls)
                self.calls.append(Call(run_id, tool, kind[tool], f"{run_id}-{i}", n))
        self.rng.shuffle(self.calls)
        gate = asyncio.Semaphore(spread)

        async def one(call: Call) -> None:
            async with gate:
                body = {
                    "runId": call.run_id,
                    "tool": call.tool,
                    "input": {"n": call.n},
                    "idempotencyKey": call.key,
                }
                data = await self.stack.persist(self.stack.subjects.calls_start, body)
                call.call_id = data["callId"]

        await asyncio.gather(*(one(c) for c in self.calls))

    async def _set_credentials(self, token: str) -> None:
        await asyncio.sleep(self.creds_after)
        body = {
            "toolsetId": self.toolset_id,
            "credentials": {"servers": {"c": {"headers": self.stack.auth_headers(token)}}},
        }
        await self.stack.persist(self.stack.subjects.toolsets_credentials_set, body)

    async def _approver(self) -> None:
        """Decide every pending approval of this load's runs, as a person would: read
        `approvals.list`, answer each with `approvals.decide`, through outages (a decide repeated
        after a lost reply gets `conflict`, which must name the decision already taken)."""
        runs = set(self.run_ids)
        while True:
            data = await self.stack.persist(self.stack.subjects.approvals_list, {})
            runs.update(self.run_ids)
            todo = [
                a for a in data["approvals"] if a["runId"] in runs and a["approvalId"] not in self.decided
            ]
            await asyncio.gather(*(self._decide(a) for a in todo))
            await asyncio.sleep(0.2)

    async def _decide(self, approval: dict[str, Any]) -> None:
        approve = approval["input"]["n"] % 3 != 0
        body = {"approvalId": approval["approvalId"], "approve": approve, "reason": "fault suite"}
        got = await self.stack.persist(self.stack.subjects.approvals_decide, body, accept="conflict")
        expected = "approved" if approve else "denied"
        if "code" in got:  # conflict: a repeat of a decide that went through
            assert got.get("details", {}).get("state") == expected, (approval, got)
        else:
            assert got["decision"] == expected, (approval, got)
        self.decided[approval["approvalId"]] = approve

    def _helpers_failed(self) -> None:
        for task in self._helpers:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def stop_helpers(self) -> None:
        self._helpers_failed()
        for task in self._helpers:
            task.cancel()
        for task in self._helpers:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def settle(self, within: float = 120.0) -> dict[str, dict[str, Any]]:
        """calls.get of every call once all are done (polling through outages)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        done: dict[str, dict[str, Any]] = {}
        while True:
            self._helpers_failed()
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
                states = Counter(f"{c.tool} {g['state']}" for c, g in zip(pending, gets, strict=True))
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
                # `Nats-Msg-Id: <callId>:<n>`, n counting the call's events from 1 as they happened
                event["_n"] = int((msg.headers or {}).get("Nats-Msg-Id", ":0").rsplit(":", 1)[1])
                by_call.setdefault(event["callId"], []).append(event)
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
    return by_call


async def leftovers(stack: Stack, run_ids: list[str], call_ids: list[str]) -> tuple[int, int, int]:
    """(slots, leases, other) of these runs and calls still in Redis: run and tool slots; leases;
    queue places, parked entries, pending approvals and undelivered outbox entries."""
    r = Redis.from_url(stack.redis_url)  # a fresh connection: Redis may have restarted under the old one
    try:
        return await _leftovers(r, stack.keys, run_ids, call_ids)
    finally:
        await r.aclose()  # type: ignore[attr-defined]


async def _leftovers(r: Any, k: Keys, run_ids: list[str], call_ids: list[str]) -> tuple[int, int, int]:
    slots = other = 0
    for run_id in run_ids:
        slots += await r.zcard(k.run_slots(run_id))
        for tool in {t for t, _, _ in MIX}:
            slots += await r.zcard(k.run_tool_slots(run_id, tool))
        other += await r.zcard(k.run_waiting(run_id))
        other += await r.scard(k.parked_by_run(run_id))
        other += await r.zcard(k.approvals_pending_run(run_id))
    ids = set(call_ids)
    leases = sum(1 for m in await r.zrange(k.call_leases, 0, -1) if m.decode() in ids)
    other += sum(1 for m in await r.zrange(k.parked_index, 0, -1) if m.decode() in ids)
    other += sum(1 for m in await r.hkeys(k.parked_where) if m.decode() in ids)
    for outbox in (k.call_events_outbox, k.approvals_outbox, k.parked_outbox):
        other += await r.xlen(outbox)
    return slots, leases, other


def _attempts_agree(events: list[dict[str, Any]], attempts: int) -> bool:
    """`attemptStarted` numbered 1..`attempts`, each once, except that the attempt a 401 parked
    starts again (same number) once it is resumed (parking spends no attempt): number k appears
    once plus once per resume after it. Checked on the numbers, not their stream order."""
    numbers = Counter(e["attempt"] for e in events if e["type"] == "attemptStarted")
    resumes: int = sum(e["type"] == "resumed" for e in events)
    if sorted(numbers) != list(range(1, attempts + 1)):
        return False
    return sum(numbers.values()) - attempts <= resumes


async def check(stack: Stack, load: Load, scenario: str, *, exact: bool = False) -> Result:
    """Every invariant of the fault suite, checked; the table row of the scenario, with what did
    not hold in `problems`. `exact` (a scenario with no fault): only `hang` calls are retried, and
    every attempt a call counted reached its server, so the server saw each call's key exactly
    `attempts` times (plus, for a parked call, up to one 401 per park; a `hang` call at most
    that, as an attempt may time out before its request is written)."""
    problems: list[str] = []
    loop = asyncio.get_running_loop()
    try:
        done = await load.settle()
    finally:
        await load.stop_helpers()
    if len({c.call_id for c in load.calls}) != len(load.calls):
        problems.append("an idempotency key gave two calls")
    outcomes: Counter[str] = Counter()
    for call in load.calls:
        outcome = done[call.call_id]["outcome"]
        code = "ok" if outcome["status"] == "ok" else outcome["error"]["code"]
        outcomes[code] += 1
        if code == "internal":
            problems.append(f"outcome internal: {call} {outcome}")
        if call.kind in ("approval", "credentials") and code != ("denied" if call.denied else "ok"):
            problems.append(f"{call.kind} call ended {code}: {call} {outcome}")
    approvals = Counter("approved" if a else "denied" for a in load.decided.values())
    wanted = sum(c.kind == "approval" for c in load.calls)
    if len(load.decided) != wanted:
        problems.append(f"{len(load.decided)} approvals decided for {wanted} approval calls")
    # the relay catches up: the stream then holds every call's events
    deadline = loop.time() + 60
    while True:
        events = await stream_events(stack, load.run_ids)
        complete = all(any(e["type"] == "completed" for e in events.get(c.call_id, [])) for c in load.calls)
        if complete or loop.time() > deadline:
            break
        await asyncio.sleep(0.5)
    agree = parked = 0
    disorder: list[str] = []
    for call in load.calls:
        got = done[call.call_id]
        evs = events.get(call.call_id, [])
        kinds = Counter(e["type"] for e in evs)
        completed = [e for e in evs if e["type"] == "completed"]
        wrong = []
        if not evs:
            problems.append(f"no events for {call}")
            continue
        if kinds["accepted"] != 1:
            wrong.append("not one accepted")
        if kinds["completed"] != 1:
            wrong.append("not one completed")
        elif completed[0]["outcome"] != got["outcome"]:
            wrong.append("completed outcome differs from calls.get")
        if not _attempts_agree(evs, got["attempts"]):
            numbers = [e["attempt"] for e in evs if e["type"] == "attemptStarted"]
            wrong.append(f"attemptStarted {numbers} for {got['attempts']} attempts")
        by_n = sorted(evs, key=lambda e: e["_n"])
        if [e["_n"] for e in by_n] != list(range(1, len(evs) + 1)):
            wrong.append(f"message ids n {[e['_n'] for e in evs]}: not 1..{len(evs)} once each")
        elif by_n[0]["type"] != "accepted" or by_n[-1]["type"] != "completed":
            wrong.append(f"in the order of n: {[e['type'] for e in by_n]}")
        if call.kind == "approval":
            decision = "denied" if call.denied else "approved"
            if kinds["approvalRequested"] != 1 or kinds[decision] != 1:
                wrong.append(f"approval events {dict(kinds)}")
        if kinds["parked"] != kinds["resumed"]:
            wrong.append(f"parked {kinds['parked']} times, resumed {kinds['resumed']}")
        parked += kinds["parked"] > 0
        if wrong:
            problems.append(f"events of {call}: {wrong}: {[e['type'] for e in evs]}")
            continue
        agree += 1
        if [e["_n"] for e in evs] != [e["_n"] for e in by_n]:
            # Each event is there once, the outcome agrees and their message ids give the call's
            # order, but the stream's order is not it (`in_order` fails the scenario on it).
            disorder.append(f"events of {call} out of order: {[e['type'] for e in evs]}")
    # the servers' view: every request carries its call's key; never more requests than attempts
    records = stack.server_calls()
    if any(c.idempotency_key_header != c.idempotency_key_meta for c in records):
        problems.append("a request whose Idempotency-Key header and _meta key differ")
    seen = Counter(c.idempotency_key_header for c in records)
    ran = Counter(c.idempotency_key_header for c in records if c.authorized)
    resent = resent_hang = twice = 0
    for call in load.calls:
        # a 401 parks the call without spending an attempt: the resumed request repeats its number
        attempts = done[call.call_id]["attempts"]
        # (the 401 may come before the tools/call request itself, so a parked call's may not count)
        sends = attempts + sum(e["type"] == "parked" for e in events.get(call.call_id, []))
        # (and under load a `hang` attempt's 400 ms can run out before its request is sent)
        least = 0 if call.tool.endswith(".hang") else attempts
        if seen[call.key] > sends or (exact and not least <= seen[call.key] <= sends):
            problems.append(f"{call} reached its server {seen[call.key]} times, {sends} sends counted")
        if exact and attempts > 1 and not call.tool.endswith(".hang"):
            problems.append(f"{call} took {attempts} attempts in a load without faults")
        if call.denied and seen[call.key]:
            problems.append(f"denied {call} reached its server")
        if call.kind == "at_most_once":
            twice += ran[call.key] > 1
        else:
            extra = max(0, ran[call.key] - 1)
            resent += extra
            resent_hang += extra if call.tool.endswith(".hang") else 0
    if twice:
        problems.append(f"{twice} at_most_once calls ran twice")
    deadline = loop.time() + 30
    while True:
        slots, leases, other = await leftovers(stack, load.run_ids, [c.call_id for c in load.calls])
        if slots + leases + other == 0 or loop.time() > deadline:
            break
        await asyncio.sleep(0.2)
    if slots + leases + other:
        problems.append(f"left in Redis: {slots} slots, {leases} leases, {other} other")
    return Result(
        scenario,
        len(load.calls),
        outcomes,
        resent,
        resent_hang,
        twice,
        agree,
        slots,
        leases,
        other,
        approvals,
        parked,
        time.monotonic() - load.began,
        problems,
        disorder,
    )


TABLE_ROWS: list[str] = []
"""The rows of this session's scenarios, in order (`conftest.py` prints and writes the table)."""
