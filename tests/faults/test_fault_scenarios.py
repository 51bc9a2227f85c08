"""The fault suite: a whole toolbus of processes on its own NATS and Redis (never the shared ones),
a real MCP server, a load of runs x calls with retry and at_most_once tools that answer, fail,
take their time or hang, and one fault per scenario in the middle of the burst. After each, the
invariants of `stack.check` hold (exactly one outcome per accepted call, events agreeing with
calls.get, one key per call at the server, at_most_once never twice, nothing left in Redis, no
`internal`). Each scenario prints its row of the table (run with `-s` to see them).

The short form runs in `make test`; `-m faults_long` runs the long form (bigger loads, and a
SIGKILL of every service in turn)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio

from tests.faults.stack import Load, Result, Stack, check, open_stack

pytestmark = [pytest.mark.faults, pytest.mark.timeout(600)]

HEADER = "| scenario | calls | outcomes | re-sent (same key) | events agreeing | leftovers |\n|---|---|---|---|---|---|"
ROWS: list[str] = []


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def stack() -> AsyncIterator[Stack]:
    s = await open_stack(dispatchers=2)
    try:
        yield s
    finally:
        await s.stop()
        print("\n" + HEADER + "\n" + "\n".join(ROWS))


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def toolset(stack: Stack) -> str:
    return await stack.toolset()


async def burst(
    stack: Stack,
    toolset: str,
    scenario: str,
    fault: Callable[[], Awaitable[None]] | None,
    *,
    runs: int,
    per_run: int,
    after: float = 0.3,
) -> Result:
    load = Load(stack, toolset, runs=runs, per_run=per_run, seed=len(ROWS) + 1)
    started = asyncio.create_task(load.start())
    if fault is not None:
        await asyncio.sleep(after)
        await fault()
    await started
    result = await check(stack, load, scenario)
    ROWS.append(result.row())
    print(result.row())
    return result


async def _kill_one_dispatcher(stack: Stack) -> None:
    await stack.kill(stack.services["dispatcher"][0])


async def _restart_nats(stack: Stack) -> None:
    await stack.restart_nats(down=1.0)


async def _restart_redis(stack: Stack) -> None:
    await stack.restart_redis(down=1.0)


# ---- short form (make test) ------------------------------------------------------------------------


async def test_load_without_faults(stack: Stack, toolset: str) -> None:
    result = await burst(stack, toolset, "load, no fault", None, runs=4, per_run=20)
    assert result.outcomes["ok"] > 0 and result.outcomes["toolError"] > 0


async def test_two_dispatchers_one_killed_mid_burst(stack: Stack, toolset: str) -> None:
    await burst(
        stack,
        toolset,
        "2 dispatchers, one SIGKILLed",
        lambda: _kill_one_dispatcher(stack),
        runs=4,
        per_run=20,
    )
    await stack.start_service("dispatcher")  # two again for what follows


async def test_nats_restarted_mid_burst(stack: Stack, toolset: str) -> None:
    await burst(stack, toolset, "NATS restarted (1 s down)", lambda: _restart_nats(stack), runs=4, per_run=20)


async def test_redis_restarted_mid_burst(stack: Stack, toolset: str) -> None:
    await burst(
        stack, toolset, "Redis restarted (1 s down)", lambda: _restart_redis(stack), runs=4, per_run=20
    )


# ---- long form (-m faults_long) ---------------------------------------------------------------------


@pytest.mark.faults_long
async def test_long_load(stack: Stack, toolset: str) -> None:
    await burst(stack, toolset, "long: load 20 x 50", None, runs=20, per_run=50)


@pytest.mark.faults_long
@pytest.mark.parametrize("name", ["registry", "credentials", "approval", "dispatcher"])
async def test_long_each_service_killed_and_restarted(stack: Stack, toolset: str, name: str) -> None:
    async def kill_and_restart() -> None:
        await stack.kill(stack.services[name][0])
        await asyncio.sleep(0.5)
        await stack.start_service(name)

    await burst(
        stack,
        toolset,
        f"long: {name} SIGKILLed and restarted",
        kill_and_restart,
        runs=10,
        per_run=30,
        after=0.5,
    )


@pytest.mark.faults_long
async def test_long_nats_and_redis_restarted(stack: Stack, toolset: str) -> None:
    await burst(
        stack,
        toolset,
        "long: NATS restarted, 20 x 50",
        lambda: _restart_nats(stack),
        runs=20,
        per_run=50,
        after=1.0,
    )
    await burst(
        stack,
        toolset,
        "long: Redis restarted, 20 x 50",
        lambda: _restart_redis(stack),
        runs=20,
        per_run=50,
        after=1.0,
    )
