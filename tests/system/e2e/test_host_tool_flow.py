"""Host tools end to end through the SDK, each party on its own connection and role: the registry,
the dispatcher and the approval service as processes; a harness (`Toolbus`) registers two host
tools from their declarations and calls them; a `Worker` serves them; an approver decides the one
that needs approval. In the secured mode each of them is its deploy/nats/ user (harness, worker,
approver, and each service its own), so this is the host-tool path of deploy/nats/ in use.

Proves: a host call is answered by the worker; an approval-gated host call reaches the worker only
after the approver's decision, once, with its idempotency key; the run's events, replayed by the
harness from the EVENTS stream, tell that story in order.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from toolbus import CallContext, Toolbus, Worker, host_tool

from tests.support.bus_modes import Bus
from tests.support.infra import until

pytestmark = pytest.mark.e2e


async def test_host_tools_served_by_a_worker_one_decided_by_an_approver(
    bus: Bus, service_env: dict[str, str]
) -> None:
    prefix = bus.prefix("tbht")
    env = {
        **service_env,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_REDIS_PREFIX": prefix,
        "TOOLBUS_LOG_LEVEL": "WARNING",
    }
    refunds: list[tuple[str, int]] = []

    @host_tool(name="crm.lookup")
    async def lookup(id: str) -> dict[str, str]:
        """Find a customer."""
        return {"name": f"customer {id}"}

    @host_tool(name="crm.refund", policy={"approval": True})
    async def refund(amount: int, ctx: CallContext) -> dict[str, int]:
        """Refund an amount."""
        refunds.append((ctx.idempotency_key, ctx.attempt))
        return {"refunded": amount}

    async with (
        bus.service("registry", env),
        bus.service("dispatcher", env),
        bus.service("approval", env),
    ):
        harness = Toolbus(await bus.connect("harness"), prefix)
        worker_tb = Toolbus(await bus.connect("worker"), prefix)
        approver = Toolbus(await bus.connect("approver"), prefix)
        try:
            toolset = await harness.toolsets.create(host=[lookup, refund])
            async with (
                Worker(worker_tb, tools=[lookup, refund]) as worker,
                await harness.runs.open(toolset, namespace="user-9") as run,
            ):
                assert await run.call("crm.lookup", {"id": "42"}) == {"name": "customer 42"}

                handle = await run.start("crm.refund", {"amount": 5}, idempotency_key="refund-5")
                requests = approver.approvals.requests(run_id=run.id)
                pending = await anext(requests)
                await requests.aclose()
                assert (pending.call_id, pending.tool, pending.input) == (
                    handle.call_id,
                    "crm.refund",
                    {"amount": 5},
                )
                assert refunds == []  # nothing reaches the worker before the decision
                assert await approver.approvals.approve(pending.approval_id) == "approved"
                assert await handle.result(timeout=30) == {"refunded": 5}
                assert refunds == [("refund-5", 1)]
                # The worker counts a call once its result's flush came back, which may be after
                # the dispatcher passed the result on to us.
                await until(lambda: worker.completed == 2, "the worker counts both calls")

                # Events are core publishes the stream captures: the last may follow the outcome.
                kinds: list[str] = []
                for _ in range(200):
                    events: list[Any] = [e async for e in run.events(follow=False)]
                    kinds = [str(e.type) for e in events if e.call_id == handle.call_id]
                    if kinds and kinds[-1] == "completed":
                        break
                    await asyncio.sleep(0.05)
                assert kinds[:3] == ["accepted", "approvalRequested", "approved"], kinds
                assert kinds[-1] == "completed", kinds
        finally:
            for tb in (approver, worker_tb, harness):
                await tb.close()
