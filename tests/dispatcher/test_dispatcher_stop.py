"""A dispatcher's graceful stop keeps to its grace in all: the requests being answered and the
calls running in tasks of their own share it (each used to get the whole grace, so a stop with
both kinds of call in progress took twice as long as asked). Calls still running when it ends are
left to their leases: another replica claims them."""

from __future__ import annotations

import asyncio

import pytest

from tests.dispatcher.test_dispatcher_helpers import Harness
from tests.dispatcher.test_dispatcher_mcp import mcp_toolset
from tests.support.mcp_servers import Fault, McpTestServer

pytestmark = pytest.mark.integration


async def test_requests_and_calls_in_tasks_share_the_grace(nats_url: str, redis_url: str) -> None:
    h = Harness(nats_url, redis_url)
    await h.connect()
    try:
        async with McpTestServer(name="echo") as server:
            app = await h.dispatcher()
            run = await h.open_run(await mcp_toolset(h, server.url))
            server.add_fault(Fault(hang=True), times=2)
            started = await h.ok(
                h.subjects.calls_start, {"runId": run, "tool": "echo.echo", "input": {"text": "a"}}
            )
            invoking = asyncio.create_task(
                h.request(
                    h.subjects.calls_invoke, {"runId": run, "tool": "echo.echo", "input": {"text": "b"}}
                )
            )
            await server.wait_for_calls(2)  # both are at the server, which never answers

            assert app.runner is not None
            given: list[float] = []
            runner_stop = app.runner.stop

            async def recording_stop(grace: float) -> None:
                given.append(grace)
                await runner_stop(grace)

            app.runner.stop = recording_stop  # type: ignore[method-assign]
            h.apps.remove(app)
            await app.stop(grace=1.0)

            # The invoke's request took the whole second (its call never ended): the call that
            # `calls.start` left running in a task got what was left of it, not a second more.
            assert given and given[0] < 0.5, given
            invoking.cancel()
            assert h.redis is not None
            state: dict[bytes, bytes] = await h.redis.hgetall(h.keys.call(started["callId"]))
            assert (
                state[b"state"] == b"running"
            )  # not ended by the stop: its lease lapses, then it is claimed
    finally:
        await h.close()
