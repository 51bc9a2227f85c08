"""Redis Sentinel: a master, a replica and three sentinels (`redis-server --sentinel`) on free
ports; the dispatcher and the credentials service find the master through the sentinels
(`TOOLBUS_REDIS_SENTINELS`). The master is killed (`kill -9`) in the middle of a burst of calls;
the sentinels promote the replica; the services carry on against it by themselves, and every
call that was acknowledged (`calls.start` answered with its callId) is still that call and
finishes. Prints the figures (`pytest -s`): calls sent, outcomes, retries, lost, time to recover.

What an asynchronous-replication failover can lose is in docs/design.md ("Production").
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.integration.test_dispatcher_helpers import Harness
from tests.support.burst import run_burst
from tests.support.infra import (
    LocalServer,
    aservice_process,
    free_port,
    start_redis_sentinel,
    start_redis_server,
)
from tests.support.mcp_servers import McpTestServer, echo_tools

pytestmark = pytest.mark.e2e

MASTER = "toolbus"
CALLS = 160


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
            return len(client.sentinel_slaves(MASTER))
        finally:
            client.close()

    def master_address(self) -> tuple[str, int]:
        client = redis.Redis(port=self.sentinel_ports[0])
        try:
            host, port = client.sentinel_get_master_addr_by_name(MASTER)
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
    try:
        async with McpTestServer(name="s") as server:
            tools = [{k: t[k] for k in ("name", "inputSchema") if k in t} for t in echo_tools()]
            ts = await h.toolset({"servers": [{"name": "s", "url": server.url, "tools": tools}]})
            async with (
                aservice_process("dispatcher", env, log_dir=tmp_path),
                aservice_process("credentials", env, log_dir=tmp_path),
            ):
                run = await h.open_run(ts)

                def kill_master(acked: int) -> None:
                    if acked == CALLS // 3 and not killed_at:
                        sentinels.master.proc.kill()
                        killed_at.append(time.monotonic())

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
            deliveries = [c.idempotency_key_header for c in server.calls]
    finally:
        h.redis = None  # its URL pointed at the replica before promotion; keys are dropped with the servers
        await h.close()

    recovered = report.recovered_after(killed_at[0]) if killed_at else None
    print(
        f"\nsentinel failover: sent {report.sent}, acknowledged {len(report.acknowledged)}, "
        f"outcomes {report.statuses()}, lost {len(report.lost)}, unavailable retried "
        f"{report.retried_unavailable}, timeouts retried {report.retried_timeout}, deliveries "
        f"{len(deliveries)} for {len(set(deliveries))} keys, requests failed for "
        f"{recovered if recovered is None else round(recovered, 2)} s after the kill, the calls in flight finished within "
        f"{report.in_flight_done_after(killed_at[0]) if killed_at else 0:.2f} s, master now {new_master}"
    )
    assert killed_at, "the master was never killed"
    assert new_master == ("127.0.0.1", sentinels.replica_port)
    assert level == {"level": "toolset"}
    assert report.lost == []
    assert report.statuses() == {"ok": CALLS}
    assert set(deliveries) == {f"sentinel-{i}" for i in range(CALLS)}
    assert report.other_errors == []
