"""The fault suite: a whole toolbus of processes on its own NATS and Redis (never the shared ones),
two real MCP servers, a load of runs x calls with retry and at_most_once tools that answer, fail,
take their time or hang, tools behind an approval and behind credentials that go stale, and one
fault per scenario in the middle of the burst. After each, the invariants of `stack.check` hold
(exactly one outcome per accepted call, events agreeing with calls.get, every request carrying its
call's key and no more requests than attempts, at_most_once never twice, nothing left in Redis, no
`internal`). Each scenario adds its row to the table that `conftest.py` prints at the end of the
session and writes to `.cache/faults-table.md` (or `$TOOLBUS_FAULTS_TABLE`).

The short form runs in `make test`; `-m faults_long` runs the long form (bigger loads, and a
SIGKILL of every service in turn under them)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio

from tests.system.faults.stack import TABLE_ROWS, Load, Result, Stack, check, open_stack

pytestmark = [pytest.mark.faults, pytest.mark.timeout(600)]


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def stack() -> AsyncIterator[Stack]:
    s = await open_stack(dispatchers=2)
    try:
        yield s
    finally:
        await s.stop()


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
    """A load with `fault` injected `after` seconds into it; the credentials of server `c` are set
    again just after the fault began (while a killed service is still down), or 1.5 s into a
    load without a fault (once a good part of it has started)."""
    creds_after = after + 0.2 if fault is not None else 1.5
    load = Load(stack, toolset, runs=runs, per_run=per_run, seed=len(TABLE_ROWS) + 1, creds_after=creds_after)
    started = asyncio.create_task(load.start())
    if fault is not None:
        await asyncio.sleep(after)
        await fault()
    await started
    result = await check(stack, load, scenario, exact=fault is None)
    TABLE_ROWS.append(result.row())
    print(result.row())
    assert not result.problems, "\n".join(result.problems[:20])
    return result


def in_order(*results: Result) -> None:
    """Last in a test: each call's events in the stream's order (`accepted` first, `completed`
    last, `n` rising). Every event is there exactly once and agrees with calls.get (checked in
    `burst`); the relay (one replica at a time, each call's next event only after JetStream acked
    the one before) also keeps them in order, whatever was killed or restarted."""
    disorder = [d for r in results for d in r.disorder]
    assert not disorder, f"{len(disorder)} calls' events out of order in the stream: {disorder[:3]}"


async def _kill_one_dispatcher(stack: Stack) -> None:
    await stack.kill(stack.services["dispatcher"][0])


async def _restart_nats(stack: Stack) -> None:
    await stack.restart_nats(down=1.0)


async def _restart_redis(stack: Stack) -> None:
    await stack.restart_redis(down=1.0)


async def _kill_and_restart(stack: Stack, name: str) -> None:
    """SIGKILL the (first) replica of `name`, start a new one half a second later. With the
    registry down, a client registers the toolset again (the same spec): it is answered once the
    new registry is up, with the same id, and `toolsets.get` lists the same tools."""
    before = (
        await stack.ok(stack.subjects.toolsets_get, {"id": stack.toolset_id}) if name == "registry" else None
    )
    await stack.kill(stack.services[name][0])
    again = (
        asyncio.create_task(stack.persist(stack.subjects.toolsets_create, stack.toolset_spec()))
        if name == "registry"
        else None
    )
    await asyncio.sleep(0.5)
    await stack.start_service(name)
    if again is not None:
        assert (await again)["id"] == stack.toolset_id
        after = await stack.persist(stack.subjects.toolsets_get, {"id": stack.toolset_id})
        # the same toolset; how far its background embedding got (`vectors`) may differ
        assert before is not None
        after.pop("vectors", None)
        before.pop("vectors", None)
        assert after == before


# ---- short form (make test) ------------------------------------------------------------------------


async def test_load_without_faults(stack: Stack, toolset: str) -> None:
    result = await burst(stack, toolset, "load, no fault", None, runs=4, per_run=20)
    assert result.outcomes["ok"] > 0 and result.outcomes["toolError"] > 0
    assert result.parked > 0, "no call parked for credentials: the credentials path was not exercised"
    assert sum(result.approvals.values()) > 0, "no approval: the approval path was not exercised"
    in_order(result)


async def test_two_dispatchers_one_killed_mid_burst(stack: Stack, toolset: str) -> None:
    try:
        result = await burst(
            stack,
            toolset,
            "2 dispatchers, one SIGKILLed",
            lambda: _kill_one_dispatcher(stack),
            runs=4,
            per_run=20,
        )
    finally:
        await stack.start_service("dispatcher")  # two again for what follows
    in_order(result)


@pytest.mark.parametrize("name", ["registry", "credentials", "approval"])
async def test_service_killed_and_restarted(stack: Stack, toolset: str, name: str) -> None:
    result = await burst(
        stack,
        toolset,
        f"{name} SIGKILLed and restarted",
        lambda: _kill_and_restart(stack, name),
        runs=2,
        per_run=15,
    )
    in_order(result)


async def test_nats_restarted_mid_burst(stack: Stack, toolset: str) -> None:
    result = await burst(
        stack, toolset, "NATS restarted (1 s down)", lambda: _restart_nats(stack), runs=4, per_run=20
    )
    in_order(result)


async def test_redis_restarted_mid_burst(stack: Stack, toolset: str) -> None:
    result = await burst(
        stack, toolset, "Redis restarted (1 s down)", lambda: _restart_redis(stack), runs=4, per_run=20
    )
    in_order(result)


# ---- long form (-m faults_long) ---------------------------------------------------------------------


@pytest.mark.faults_long
async def test_long_load(stack: Stack, toolset: str) -> None:
    result = await burst(stack, toolset, "long: load 20 x 50", None, runs=20, per_run=50)
    in_order(result)


@pytest.mark.faults_long
@pytest.mark.parametrize("name", ["registry", "credentials", "approval", "dispatcher"])
async def test_long_each_service_killed_and_restarted(stack: Stack, toolset: str, name: str) -> None:
    result = await burst(
        stack,
        toolset,
        f"long: {name} SIGKILLed and restarted, 10 x 30",
        lambda: _kill_and_restart(stack, name),
        runs=10,
        per_run=30,
        after=0.5,
    )
    in_order(result)


@pytest.mark.faults_long
async def test_long_nats_restarted(stack: Stack, toolset: str) -> None:
    result = await burst(
        stack,
        toolset,
        "long: NATS restarted (1 s down), 20 x 50",
        lambda: _restart_nats(stack),
        runs=20,
        per_run=50,
        after=1.0,
    )
    in_order(result)


@pytest.mark.faults_long
async def test_long_redis_restarted(stack: Stack, toolset: str) -> None:
    result = await burst(
        stack,
        toolset,
        "long: Redis restarted (1 s down), 20 x 50",
        lambda: _restart_redis(stack),
        runs=20,
        per_run=50,
        after=1.0,
    )
    in_order(result)
