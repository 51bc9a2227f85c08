"""Approval service figures on this machine: how long from `ApprovalNeeded` published to
`approval.requested` seen, and `approvals.decide` round trips (the Lua decision plus the
acknowledged JetStream publish of the decision), sequential and 16 in flight.

    uv run python services/approval/bench/approval_bench.py [--n 500]

Uses TOOLBUS_NATS_URL / TOOLBUS_REDIS_URL (default: the local servers) and a fresh prefix, and
deletes what it wrote.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import time
import uuid
from typing import Any

import nats
from redis.asyncio import Redis
from toolbus_approval.app import ApprovalApp
from toolbus_approval.settings import ApprovalSettings
from toolbus_common.canonical import sha256_hex
from toolbus_common.clock import now_iso
from toolbus_common.settings import Settings
from toolbus_contracts.internal import ApprovalNeeded


def figures(label: str, samples: list[float]) -> None:
    ordered = sorted(samples)
    p50 = statistics.median(ordered) * 1000
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000
    print(f"{label:<44} p50 {p50:7.3f} ms   p99 {p99:7.3f} ms   (n={len(ordered)})")


def needed(run_id: str) -> ApprovalNeeded:
    data = {"amount": 5, "note": "x" * 200}
    return ApprovalNeeded(
        approval_id=f"apr_{uuid.uuid4().hex}",
        call_id=f"call_{uuid.uuid4().hex}",
        run_id=run_id,
        namespace="bench",
        toolset_id="ts_bench",
        tool="shop.refund",
        input=data,
        input_digest=sha256_hex(data),
        requested_at=now_iso(),
    )


async def main(n: int) -> None:
    prefix = f"tbbench{secrets.token_hex(3)}"
    settings = Settings(
        nats_url=os.environ.get("TOOLBUS_NATS_URL", "nats://127.0.0.1:4222"),
        redis_url=os.environ.get("TOOLBUS_REDIS_URL", "redis://127.0.0.1:6379/0"),
        subject_prefix=prefix,
    )
    app = ApprovalApp(settings, ApprovalSettings())
    await app.start()
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    subjects = settings.subjects
    stream = settings.js_name("INTERNAL")
    seen: dict[str, asyncio.Future[float]] = {}

    async def on_event(msg: Any) -> None:
        fut = seen.get(json.loads(msg.data)["approvalId"])
        if fut is not None and not fut.done():
            fut.set_result(time.perf_counter())

    await nc.subscribe(subjects.approvals_requested, cb=on_event)
    try:
        run_id = f"run_{uuid.uuid4().hex}"
        announce: list[float] = []
        ids: list[str] = []
        for _ in range(n):
            command = needed(run_id)
            fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            seen[command.approval_id] = fut
            started = time.perf_counter()
            await js.publish(subjects.internal_approval_requests, command.wire_json(), stream=stream)
            announce.append(await asyncio.wait_for(fut, 10) - started)
            ids.append(command.approval_id)
        figures("ApprovalNeeded -> approval.requested", announce)

        started = time.perf_counter()
        msg = await nc.request(subjects.approvals_list, json.dumps({"runId": run_id}).encode(), timeout=10)
        listed = len(json.loads(msg.data)["data"]["approvals"])
        print(
            f"{'approvals.list of one run':<44} {(time.perf_counter() - started) * 1000:7.3f} ms for {listed}"
        )

        half = len(ids) // 2
        sequential: list[float] = []
        for approval_id in ids[:half]:
            body = json.dumps({"approvalId": approval_id, "approve": True}).encode()
            started = time.perf_counter()
            reply = await nc.request(subjects.approvals_decide, body, timeout=10)
            sequential.append(time.perf_counter() - started)
            assert json.loads(reply.data)["ok"]
        figures("approvals.decide, sequential", sequential)

        limit = asyncio.Semaphore(16)
        concurrent: list[float] = []

        async def decide(approval_id: str) -> None:
            async with limit:
                body = json.dumps({"approvalId": approval_id, "approve": False}).encode()
                started = time.perf_counter()
                await nc.request(subjects.approvals_decide, body, timeout=10)
                concurrent.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(decide(i) for i in ids[half:]))
        elapsed = time.perf_counter() - started
        figures("approvals.decide, 16 in flight", concurrent)
        print(f"{'decisions per second, 16 in flight':<44} {len(concurrent) / elapsed:7.0f}")
    finally:
        await app.stop()
        for name in ("INTERNAL", "EVENTS"):
            with contextlib.suppress(Exception):
                await js.delete_stream(settings.js_name(name))
        await nc.drain()
        redis = Redis.from_url(settings.redis_url)
        keys = [k async for k in redis.scan_iter(match=f"{prefix}:*", count=500)]
        if keys:
            await redis.unlink(*keys)
        await redis.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="approvals to create (half approved, half denied)")
    asyncio.run(main(parser.parse_args().n))
