"""Redis Sentinel: a master, a replica and three sentinels (`redis-server --sentinel`) on free
ports; the dispatcher, the credentials service and the approval service find the master through
the sentinels (`TOOLBUS_REDIS_SENTINELS`). The master is killed (`kill -9`) in the middle of a
burst of calls; the sentinels promote the replica; the services carry on against it by
themselves, and every call that was acknowledged (`calls.start` answered with its callId) is
still that call and finishes. Approval-gated calls requested before the failover (pending on the
old master) and after it are all decided after it: each exactly once (a second decision is
`conflict`, one decision event per call), approved ones sent once, denied ones never, none left
pending. Prints the figures (`pytest -s`): calls sent, outcomes, duplicates, retries, lost, time
to recover, the approvals before/after.

What an asynchronous-replication failover can lose is in deploy/README.md and docs/design.md
("Redis failover: what it can lose").
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats.errors
import pytest
import redis
from toolbus_common.keys import Keys

from tests.dispatcher.test_dispatcher_helpers import Harness
from tests.support.burst import run_burst
from tests.support.infra import (
    LocalServer,
    aservice_process,
    free_port,
    js_name,
    start_redis_sentinel,
    start_redis_server,
)
from tests.support.mcp_servers import McpTestServer, echo_tools

pytestmark = pytest.mark.e2e

MASTER = "toolbus"
CALLS = 160
APPROVALS_BEFORE = 12
APPROVALS_AFTER = 8


def _until(check: object, what: str, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {limit:.0f}s: {what}")


class SentinelSet:
    def __init__(self, tmp: Path) -> None:
        self.master_port, self.replica_port = free_port(), free_port()
        self.servers: list[LocalServer] = []
        self.master = self._keep(start_redis_server(self.master_port, tmp / "m", tmp / "m.log"))
        self.replica = self._keep(
            start_redis_server(
                self.replica_port,
                tmp / "r",
                tmp / "r.log",
                args=["--replicaof", "127.0.0.1", str(self.master_port)],
            )
        )
        _until(
            lambda: redis.Redis(port=self.replica_port).info("replication")["master_link_status"] == "up",
            "the replica to sync",
        )
        self.sentinel_ports = [free_port() for _ in range(3)]
        for port in self.sentinel_ports:
            self._keep(
                start_redis_sentinel(
                    port, self.master_port, tmp / "s", tmp / f"s{port}.log", master_name=MASTER
                )
            )
        _until(lambda: self.known_replicas() >= 1, "the sentinels to see the replica")

    def _keep(self, server: LocalServer) -> LocalServer:
        self.servers.append(server)
        return server

    def known_replicas(self) -> int:
        client = redis.Redis(port=self.sentinel_ports[0])
        try:
            return len(client.sentinel_slaves(MASTER))  # type: ignore[no-untyped-call]  # types-redis 4.6 leaves it unannotated
        finally:
            client.close()

    def master_address(self) -> tuple[str, int]:
        client = redis.Redis(port=self.sentinel_ports[0])
        try:
            host, port = client.sentinel_get_master_addr_by_name(MASTER)  # type: ignore[no-untyped-call]  # types-redis 4.6 leaves it unannotated
            return host.decode() if isinstance(host, bytes) else host, int(port)
        finally:
            client.close()

    @property
    def setting(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelSet]:
    group = SentinelSet(tmp_path)
    try:
        yield group
    finally:
        group.stop()


async def test_services_carry_on_after_the_master_is_killed_mid_burst(
    sentinels: SentinelSet, nats_url: str, secret_key: str, tmp_path: Path
) -> None:
    h = Harness(nats_url, f"redis://127.0.0.1:{sentinels.replica_port}/0")
    await h.connect()
    env = h.env(
        TOOLBUS_REDIS_URL="redis://127.0.0.1:1/0",  # only its scheme and db count under Sentinel
        TOOLBUS_REDIS_SENTINELS=sentinels.setting,
        TOOLBUS_REDIS_SENTINEL_MASTER=MASTER,
        TOOLBUS_REDIS_POOL_TIMEOUT="2",
        TOOLBUS_SECRET_KEY=secret_key,
    )
    killed_at: list[float] = []
    approvals = ApprovalFigures()
    try:
        async with McpTestServer(name="s") as server:
            tools = [{k: t[k] for k in ("name", "inputSchema") if k in t} for t in echo_tools()]
            gated = {"echo": {"approval": True}}
            ts = await h.toolset(
                {
                    "servers": [
                        {"name": "s", "url": server.url, "tools": tools},
                        {"name": "a", "url": server.url, "tools": tools, "policies": gated},
                    ]
                }
            )
            async with (
                aservice_process("dispatcher", env, log_dir=tmp_path),
                aservice_process("credentials", env, log_dir=tmp_path),
                aservice_process("approval", env, log_dir=tmp_path),
            ):
                run = await h.open_run(ts)
                # Approvals requested before the failover, pending (stored by the old master).
                await approvals.request(h, run, "before", APPROVALS_BEFORE)
                watcher: list[asyncio.Task[None]] = []

                def kill_master(acked: int) -> None:
                    if acked == CALLS // 3 and not killed_at:
                        sentinels.master.proc.kill()
                        killed_at.append(time.monotonic())
                        watcher.append(asyncio.create_task(approvals.watch_recovery(h, run, killed_at[0])))

                report = await run_burst(
                    h.nc, h.prefix, run, "s.echo", CALLS, key_prefix="sentinel", on_ack=kill_master
                )
                new_master = sentinels.master_address()
                # The credentials service writes to the promoted master too.
                level = await h.ok(
                    h.subjects.toolsets_credentials_set,
                    {"toolsetId": ts, "credentials": {"servers": {"s": {"headers": {"X-K": "v"}}}}},
                    within=30,
                )
                await asyncio.gather(*watcher)
                # More requested after it, then every one decided (even approved, odd denied).
                await approvals.request(h, run, "after", APPROVALS_AFTER)
                await approvals.decide_all(h)
                await approvals.outcomes(h, run)
                approvals.events = await approval_events(h, run)
                promoted = redis.Redis(port=sentinels.replica_port)
                try:
                    approvals.left_pending = int(promoted.zcard(Keys(h.prefix).approvals_pending))
                finally:
                    promoted.close()
            deliveries = [c.idempotency_key_header for c in server.calls]
    finally:
        h.redis = None  # its URL pointed at the replica before promotion; keys are dropped with the servers
        await h.close()

    burst_keys = [k for k in deliveries if k and k.startswith("sentinel-")]
    recovered = report.recovered_after(killed_at[0]) if killed_at else None
    print(
        f"\nsentinel failover: sent {report.sent}, acknowledged {len(report.acknowledged)}, "
        f"outcomes {report.statuses()}, lost {len(report.lost)}, unavailable retried "
        f"{report.retried_unavailable}, timeouts retried {report.retried_timeout}, deliveries "
        f"{len(burst_keys)} for {len(set(burst_keys))} keys (duplicates "
        f"{len(burst_keys) - len(set(burst_keys))}), requests failed for "
        f"{recovered if recovered is None else round(recovered, 2)} s after the kill, the calls in flight "
        f"finished within {report.in_flight_done_after(killed_at[0]) if killed_at else 0:.2f} s, "
        f"master now {new_master}"
    )
    print(approvals.summary(deliveries))
    assert killed_at, "the master was never killed"
    assert new_master == ("127.0.0.1", sentinels.replica_port)
    assert level == {"level": "toolset"}
    assert report.lost == []
    assert report.statuses() == {"ok": CALLS}
    assert set(burst_keys) == {f"sentinel-{i}" for i in range(CALLS)}
    assert report.other_errors == []
    approvals.check(deliveries)


class ApprovalFigures:
    """Approval-gated calls around the failover: requested before it (`before-*`) or after it
    (`after-*`), all decided after it; each must be decided exactly once and end as decided."""

    def __init__(self) -> None:
        self.calls: dict[str, str] = {}
        """idempotency key -> callId."""
        self.approval_ids: dict[str, str] = {}
        """idempotency key -> approvalId."""
        self.decisions: dict[str, str] = {}
        self.second_decisions: dict[str, str] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.events: dict[str, list[str]] = {}
        self.unavailable = 0
        self.timeouts = 0
        self.answered_after: float | None = None
        """Seconds from the kill until `approvals.list` answered again with every approval requested
        before the failover still pending."""
        self.left_pending = -1

    async def request(self, h: Harness, run: str, group: str, n: int) -> None:
        keys = [f"{group}-{i}" for i in range(n)]
        for key in keys:
            body = {"runId": run, "tool": "a.echo", "input": {"text": key}, "idempotencyKey": key}
            self.calls[key] = (await self._ok(h, h.subjects.calls_start, body))["callId"]
        by_call = {v: k for k, v in self.calls.items()}
        for _ in range(600):  # bounded: the approval service takes ApprovalNeeded from INTERNAL
            listed = await self._ok(h, h.subjects.approvals_list, {"runId": run})
            for a in listed["approvals"]:
                if a["callId"] in by_call:
                    self.approval_ids[by_call[a["callId"]]] = a["approvalId"]
            if all(k in self.approval_ids for k in keys):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"approvals {group} never all pending: {sorted(self.approval_ids)}")

    async def watch_recovery(self, h: Harness, run: str, killed: float) -> None:
        before = {v for k, v in self.approval_ids.items() if k.startswith("before-")}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                reply = await h.request(h.subjects.approvals_list, {"runId": run}, within=10)
            except nats.errors.TimeoutError:
                self.timeouts += 1
                continue
            if reply.get("ok") and before <= {a["approvalId"] for a in reply["data"]["approvals"]}:
                self.answered_after = time.monotonic() - killed
                return
            if not reply.get("ok"):
                assert reply["error"]["code"] == "unavailable", reply
                self.unavailable += 1
            await asyncio.sleep(0.05)

    async def decide_all(self, h: Harness) -> None:
        for n, (key, approval_id) in enumerate(sorted(self.approval_ids.items())):
            body: dict[str, Any] = {"approvalId": approval_id, "approve": n % 2 == 0}
            if n % 2:
                body["reason"] = "no"
            self.decisions[key] = (await self._ok(h, h.subjects.approvals_decide, body))["decision"]
            again = await h.request(h.subjects.approvals_decide, {"approvalId": approval_id, "approve": True})
            self.second_decisions[key] = "ok" if again.get("ok") else again["error"]["code"]

    async def outcomes(self, h: Harness, run: str) -> None:
        for key in self.calls:
            body = {"runId": run, "tool": "a.echo", "input": {"text": key}, "idempotencyKey": key}
            self.results[key] = (await self._ok(h, h.subjects.calls_invoke, body, within=30))["outcome"]

    async def _ok(self, h: Harness, subject: str, body: dict[str, Any], within: float = 10) -> dict[str, Any]:
        for _ in range(100):  # `unavailable` while Redis fails over: the same request again
            reply = await h.request(subject, body, within=within)
            if reply.get("ok"):
                data: dict[str, Any] = reply["data"]
                return data
            assert reply["error"]["code"] == "unavailable", reply
            self.unavailable += 1
            await asyncio.sleep(0.1)
        raise AssertionError(f"{subject} stayed unavailable")

    def summary(self, deliveries: list[str | None]) -> str:
        approved = [k for k, d in self.decisions.items() if d == "approved"]
        sent = {k: deliveries.count(k) for k in self.calls}
        decided_events = {
            k: [e for e in self.events.get(cid, []) if e in ("approved", "denied")]
            for k, cid in self.calls.items()
        }
        answered = None if self.answered_after is None else round(self.answered_after, 2)
        return (
            f"approvals: {sum(1 for k in self.calls if k.startswith('before-'))} requested before the "
            f"failover and {sum(1 for k in self.calls if k.startswith('after-'))} after, all decided after: "
            f"{len(approved)} approved, {len(self.decisions) - len(approved)} denied; second decisions "
            f"{sorted(set(self.second_decisions.values()))}; decision events per call "
            f"{sorted({len(v) for v in decided_events.values()})}; approved calls sent "
            f"{sum(sent[k] for k in approved)} times for {len(approved)}, denied sent "
            f"{sum(v for k, v in sent.items() if k not in approved)}; approvals.list answered with every "
            f"earlier approval {answered} s after the kill ({self.unavailable} unavailable replies, "
            f"{self.timeouts} timeouts retried); pending left {self.left_pending}"
        )

    def check(self, deliveries: list[str | None]) -> None:
        assert len(self.calls) == APPROVALS_BEFORE + APPROVALS_AFTER
        assert self.answered_after is not None, "approvals.list never answered after the kill"
        assert set(self.decisions) == set(self.calls)
        for n, key in enumerate(sorted(self.approval_ids)):
            expected = "approved" if n % 2 == 0 else "denied"
            assert self.decisions[key] == expected
            assert self.second_decisions[key] == "conflict"
            decided = [e for e in self.events[self.calls[key]] if e in ("approved", "denied")]
            assert decided == [expected], (key, self.events[self.calls[key]])
            if expected == "approved":
                assert self.results[key] == {"status": "ok", "output": {"text": key}}
                assert deliveries.count(key) == 1, key
            else:
                assert self.results[key]["error"]["code"] == "denied"
                assert deliveries.count(key) == 0, key
        assert self.left_pending == 0


async def approval_events(h: Harness, run: str) -> dict[str, list[str]]:
    """callId -> the types of its events in the EVENTS stream (once each call has `completed`)."""
    out: dict[str, list[str]] = {}
    for _ in range(100):
        assert h.nc is not None
        sub = await h.nc.jetstream().subscribe(
            h.subjects.run_events(run), stream=js_name(h.prefix, "EVENTS"), ordered_consumer=True
        )
        out = {}
        try:
            while True:
                msg = await sub.next_msg(timeout=5)
                event = json.loads(msg.data)
                out.setdefault(event["callId"], []).append(event["type"])
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
        if all(kinds[-1] == "completed" for kinds in out.values()):
            return out
        await asyncio.sleep(0.1)
    return out


async def test_a_master_refusing_writes_for_want_of_replicas_is_unavailable_not_a_bug(
    tmp_path: Path,
) -> None:
    """`min-replicas-to-write` (the option deploy/README.md names to narrow what a failover can
    lose): with too few replicas keeping up, the master answers writes `NOREPLICAS`. Through
    redis-py and through the dispatcher's script pipe that is a backing-store fault (`unavailable`,
    retried), not `internal`; reads still work."""
    from toolbus_common.connections import connect_redis, connect_script_pipe
    from toolbus_common.faults import is_backing_store_fault, unavailable
    from toolbus_common.script_pipe import ScriptReplyError
    from toolbus_common.settings import Settings

    port = free_port()
    master = start_redis_server(
        port, tmp_path / "m", tmp_path / "m.log", args=["--min-replicas-to-write", "1"]
    )
    settings = Settings(redis_url=f"redis://127.0.0.1:{port}/0")
    client = connect_redis(settings)
    pipe = connect_script_pipe(settings, client)
    try:
        assert await client.get("tbt:noreplicas") is None
        with pytest.raises(redis.exceptions.ResponseError) as refused:
            await client.set("tbt:noreplicas", "v")
        assert str(refused.value).startswith("NOREPLICAS")
        assert is_backing_store_fault(refused.value)
        sha = await client.script_load("return redis.call('SET', KEYS[1], ARGV[1])")  # type: ignore[no-untyped-call]  # types-redis 4.6 leaves it unannotated
        with pytest.raises(ScriptReplyError) as script_refused:
            await pipe.evalsha(sha, ["tbt:noreplicas"], ["v"])
        assert is_backing_store_fault(script_refused.value)
        assert unavailable(script_refused.value).details == {"store": "Redis"}
    finally:
        await pipe.aclose()
        await client.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag
        master.stop()
