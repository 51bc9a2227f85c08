"""Redis restarted under a steady load of reads and writes through every service that uses it
(issue 38, items 1 and 4). Once every `/readyz` is 200 again, 300 requests of each kind sent at
once are all answered `ok`: none `unavailable` because a pooled connection was dead (before the
fix 33 of 1,500 were), and no at_most_once call reached its tool twice. What the services logged
through the outage is one warning when Redis went, one line when it came back (with the count of
requests answered `unavailable` meanwhile, the count the clients saw) and no traceback.

The 5 s outage runs in the short form; the 40 s one in the long form (`-m faults_long`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.system.faults.redis_outage import KINDS, Outcome, restart_under_load
from tests.system.faults.stack import Stack, open_stack

pytestmark = [pytest.mark.faults, pytest.mark.timeout(600)]

SERVED_BY = {
    "dispatcher": ("calls.get", "calls.start", "runs.open"),
    "approval": ("approvals.list",),
    "credentials": ("runs.credentials.set",),
}
"""The kinds each Redis-using service answers (the registry does not use Redis)."""


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def stack() -> AsyncIterator[Stack]:
    s = await open_stack(dispatchers=1)
    try:
        yield s
    finally:
        await s.stop()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def toolset(stack: Stack) -> str:
    return await stack.toolset()


def assert_recovered(out: Outcome) -> None:
    for kind in KINDS:
        codes = out.after.codes[kind]
        assert codes == {"ok": 300}, (kind, dict(codes))
    assert out.applied_twice == 0
    assert out.during.unavailable() > 0  # the load did meet the outage


def assert_logged_once(out: Outcome) -> None:
    logs = out.logs
    by_service = {name.rsplit("-", 1)[0]: name for name in logs.lines}
    assert logs.tracebacks == {}, logs.sample
    for service, kinds in SERVED_BY.items():
        name = by_service[service]
        assert logs.unreachable.get(name) == 1, (service, logs.unreachable)
        assert logs.back.get(name) == 1, (service, logs.back)
        assert logs.reported_unavailable[name] == sum(out.during.unavailable(k) for k in kinds), service
    assert logs.lines[by_service["registry"]] == 0


@pytest.mark.asyncio(loop_scope="session")
async def test_redis_down_5s_no_request_fails_after_readyz_and_the_outage_is_two_log_lines(
    stack: Stack, toolset: str
) -> None:
    out = await restart_under_load(stack, toolset, down=5.0)
    assert_recovered(out)
    assert_logged_once(out)


@pytest.mark.faults_long
@pytest.mark.asyncio(loop_scope="session")
async def test_redis_down_40s_no_request_fails_after_readyz_and_the_outage_is_two_log_lines(
    stack: Stack, toolset: str
) -> None:
    out = await restart_under_load(stack, toolset, down=40.0)
    assert_recovered(out)
    assert_logged_once(out)
