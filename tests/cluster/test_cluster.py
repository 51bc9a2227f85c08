"""A 3-node JetStream cluster (three nats-server processes on free ports, routed) under two
replicas of every service as processes, with `TOOLBUS_JS_REPLICAS=3`: the streams, the KV bucket
and the object store are R3; a burst of calls is spread over both dispatchers; one NATS node and
one dispatcher are killed (`kill -9`) mid-burst; no call is lost, each call keeps its callId, and
every call reaches the MCP server under its own idempotency key only (an idempotent server applies
each once). Prints the figures (`pytest -s`).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import nats
import pytest
from redis.asyncio import Redis
from toolbus_common.keys import Keys

from tests.support.burst import run_burst
from tests.support.infra import (
    ServiceProcess,
    drop_deployment_state,
    js_name,
    launch_service,
    request,
    start_nats_cluster,
    stop_process,
    unique_prefix,
    wait_ready,
)
from tests.support.mcp_servers import McpTestServer

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

SERVICES = ("registry", "dispatcher", "approval", "credentials")
CALLS = 150


async def _jetstream_ready(nc: Any, limit: float = 60.0) -> None:
    """Wait (bounded) until the cluster has a JetStream meta leader: account info answers."""
    deadline = time.monotonic() + limit
    while True:
        try:
            await nc.jetstream(timeout=2).account_info()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_a_burst_survives_a_nats_node_and_a_dispatcher_killed(
    tmp_path: Path, redis_url: str, secret_key: str
) -> None:
    servers = start_nats_cluster(tmp_path / "nats", size=3)
    urls = ",".join(s.url for s in servers)
    prefix = unique_prefix("tbc")
    env = {
        "TOOLBUS_NATS_URL": urls,
        "TOOLBUS_REDIS_URL": redis_url,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_SECRET_KEY": secret_key,
        "TOOLBUS_JS_REPLICAS": "3",
        "TOOLBUS_LOG_LEVEL": "WARNING",
        "TOOLBUS_DISPATCHER_LEASE": "2",
        "TOOLBUS_DISPATCHER_RETRY_BACKOFF": "0.05",
        "TOOLBUS_DISPATCHER_RETRY_BACKOFF_MAX": "0.2",
    }
    procs: list[ServiceProcess] = []
    nc = await nats.connect(servers=urls.split(","), max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        await _jetstream_ready(nc)
        for name in SERVICES:
            for replica in range(2):
                procs.append(launch_service(name, env, log_dir=tmp_path / f"{name}{replica}"))
        for proc in procs:
            await asyncio.to_thread(
                wait_ready, proc.ready_url, proc.proc, proc.log_path, what=proc.name, timeout=120
            )
        dispatchers = [p for p in procs if p.name == "dispatcher"]

        js = nc.jetstream(timeout=5)
        async with McpTestServer(name="s") as server:
            created = await request(
                nc, f"{prefix}.toolsets.create", {"mcp": [{"name": "s", "url": server.url}]}, timeout=60
            )
            assert created["ok"], created
            opened = await request(
                nc, f"{prefix}.runs.open", {"toolsetId": created["data"]["id"]}, timeout=30
            )
            run_id = opened["data"]["runId"]
            replicas = {
                name: (await js.stream_info(name)).config.num_replicas
                for name in (
                    js_name(prefix, "EVENTS"),
                    js_name(prefix, "INTERNAL"),
                    f"OBJ_{js_name(prefix, 'toolsets')}",
                )
            }

            killed_at: list[float] = []

            def kill_node_and_dispatcher(acked: int) -> None:
                if acked == CALLS // 3 and not killed_at:
                    servers[0].proc.kill()
                    dispatchers[0].kill()
                    killed_at.append(time.monotonic())

            report = await run_burst(
                nc, prefix, run_id, "s.echo", CALLS, key_prefix="cluster", on_ack=kill_node_and_dispatcher
            )
            deliveries = [c.idempotency_key_header for c in server.calls]

        redis: Any = Redis.from_url(redis_url)
        keys = Keys(prefix)
        try:
            owners = {
                (await redis.hget(keys.call(cid), "owner") or b"").decode()
                for cid in report.acknowledged.values()
            }
        finally:
            await redis.aclose()
    finally:
        for proc in procs:
            await asyncio.to_thread(stop_process, proc.proc, 5.0)
        await drop_deployment_state(nc, redis_url, prefix)
        await nc.close()
        for s in servers:
            s.stop()

    redelivered = len(deliveries) - len(set(deliveries))
    print(
        f"\ncluster: sent {report.sent}, acknowledged {len(report.acknowledged)}, outcomes "
        f"{report.statuses()}, lost {len(report.lost)}, unavailable retried {report.retried_unavailable}, "
        f"timeouts retried {report.retried_timeout}, deliveries {len(deliveries)} for "
        f"{len(set(deliveries))} keys ({redelivered} redelivered with their key), finished by "
        f"{len(owners - {''})} dispatchers, requests failed for "
        f"{report.recovered_after(killed_at[0]) if killed_at else 0:.2f} s after the kills, the calls in "
        f"flight at the kills finished within {report.in_flight_done_after(killed_at[0]) if killed_at else 0:.2f} s, "
        f"replicas {replicas}"
    )
    assert killed_at
    assert set(replicas.values()) == {3}
    assert report.lost == []
    assert report.statuses() == {"ok": CALLS}
    assert all(report.outcomes[f"cluster-{i}"]["output"] == {"text": f"cluster-{i}"} for i in range(CALLS))
    # Every call reached the server under its own key, and no delivery carried a key of no call.
    assert set(deliveries) == {f"cluster-{i}" for i in range(CALLS)}
    assert len(owners - {""}) == 2
