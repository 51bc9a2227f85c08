"""Lease renewal against a Redis link gone silent (`CuttingProxy.silence(deaf=True)`: neither
commands nor answers get through, nothing is closed), with a real dispatcher, real NATS and a real
Redis.

redis-py alone waits `TOOLBUS_REDIS_SOCKET_TIMEOUT` (10 s by default) for an answer, and the
renewal loop sleeps a third of a lease after a failed renewal, so one renewal stuck on a silent
connection let the leases of running calls lapse: another replica's reaper then claims them and
runs them again (attempt 2). Each renewal attempt is now bounded by a quarter of the lease and the
time left, and sent again on another connection until it goes through, within moments of Redis
answering again. The silence starts just before a renewal is due (the worst moment: the last one
that went through is a third of a lease old) and lasts half the lease: the old code (the stuck
attempt until Redis speaks, then a third of a lease's sleep) lets the lease lapse; now a host call
that stays running across it keeps its lease the whole time (sampled from Redis directly), is
never claimed by a second dispatcher, and ends `ok` with attempts == 1.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.dispatcher.test_dispatcher_calls import Worker
from tests.dispatcher.test_dispatcher_helpers import Harness, host_tool, wait_until
from tests.support.cutting_proxy import CuttingProxy, proxy_to

pytestmark = pytest.mark.integration

LEASE = 12.0
SILENCE = LEASE / 2  # under 2/3 of the lease (less a retry's moments): survived wherever it starts


@pytest_asyncio.fixture(loop_scope="session")
async def proxy(redis_url: str) -> AsyncIterator[CuttingProxy]:
    async with proxy_to(redis_url) as p:
        yield p


async def test_a_running_call_keeps_its_lease_across_a_silent_redis_connection(
    nats_url: str, redis_url: str, proxy: CuttingProxy
) -> None:
    h = Harness(nats_url, redis_url)
    await h.connect()
    assert h.redis is not None
    try:
        # Dispatcher A reaches Redis through the proxy; its socket timeout (10 s) exceeds the lease.
        await h.dispatcher(redis_url=proxy.url, dispatcher_lease=LEASE)
        run = await h.open_run(await h.toolset({"host": [host_tool("held")]}))
        release = asyncio.Event()

        async def held(_: dict[str, Any]) -> Any:
            await release.wait()
            return "done"

        async with Worker(h, "held", held) as worker:
            started = await h.ok(h.subjects.calls_start, {"runId": run, "tool": "held", "input": {}})
            call_id = started["callId"]
            await wait_until(lambda: len(worker.tasks) == 1, what="the call running on A")
            # Dispatcher B, straight to Redis: its reaper claims A's call if A's lease lapses.
            await h.dispatcher(dispatcher_lease=LEASE)
            leases = h.keys.call_leases

            async def expiry() -> float:
                score = await h.redis.zscore(leases, call_id)  # type: ignore[union-attr]
                assert score is not None, "the call's lease is gone"
                return float(score)

            # Go silent just before A's next renewal (one third of a lease after the last): the
            # renewal that gets stuck is then the one the lease depends on longest.
            first = await expiry()

            async def renewed() -> bool:
                return await expiry() != first

            await wait_until(renewed, within=LEASE, what="a renewal of A's lease")
            # When that renewal ran (expiry: Redis's TIME then + a lease; this test's Redis is on this
            # host, so its clock is time.time()'s, as the comparisons below assume).
            last = await expiry() - LEASE
            await asyncio.sleep(max(0.0, last + LEASE / 3 - 0.3 - time.time()))
            lowest = math.inf
            silent_until = time.monotonic() + SILENCE
            proxy.silence(deaf=True)
            try:
                while time.monotonic() < silent_until:
                    lowest = min(lowest, await expiry() - time.time())
                    await asyncio.sleep(0.1)
            finally:
                proxy.speak()
            # The call stays running for half a lease more: past what the leases had before.
            after_until = time.monotonic() + LEASE / 2
            while time.monotonic() < after_until:
                lowest = min(lowest, await expiry() - time.time())
                await asyncio.sleep(0.1)
            assert proxy.lost_commands > 0  # A's commands were lost
            release.set()
            await h.wait_state(call_id, "done", within=60)
        got = await h.ok(h.subjects.calls_get, {"callId": call_id})
        print(f"\nsilent Redis for {SILENCE} s (lease {LEASE} s): lease left at its lowest {lowest:.2f} s")
        assert lowest > 0, f"the lease lapsed ({lowest:.2f} s)"
        assert got["outcome"] == {"status": "ok", "output": "done"} and got["attempts"] == 1, got
        assert [(t["callId"], t["attempt"]) for t in worker.tasks] == [(call_id, 1)]
    finally:
        proxy.speak()
        await h.close()
