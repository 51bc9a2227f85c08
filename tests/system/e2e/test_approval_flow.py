"""Approvals end to end: the registry, the dispatcher and the approval service as processes, a real
MCP server over streamable HTTP, and a harness talking the public contract only.

Proves: an approved call reaches the MCP server exactly once, with its idempotency key; a denied
call never reaches it and ends `denied` with the reason; a decision made while the dispatcher is
down takes effect when it is back; closing a run cancels its pending approval. Prints the event
sequence of one approved and one denied call (run pytest with `-s` to see it).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from toolbus_common.canonical import sha256_hex
from toolbus_common.connections import ensure_object_store

from tests.support.approvals import ApprovalClient, approval_client
from tests.support.bus_modes import Bus
from tests.support.infra import js_name, request
from tests.support.mcp_servers import McpTestServer

pytestmark = pytest.mark.e2e


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def mcp() -> AsyncIterator[McpTestServer]:
    async with McpTestServer(name="shop") as server:
        yield server


@pytest.fixture(scope="module")
def env(service_env: dict[str, str], bus: Bus) -> dict[str, str]:
    """A prefix of this module's own, so no other test's consumers see its commands."""
    prefix = bus.prefix("tbae")
    return {
        **service_env,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_REDIS_PREFIX": prefix,
        "TOOLBUS_LOG_LEVEL": "WARNING",
        "TOOLBUS_DISPATCHER_LEASE": "2",
    }


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def client(env: dict[str, str], bus: Bus, redis_url: str) -> AsyncIterator[ApprovalClient]:
    async with approval_client(bus, redis_url, env["TOOLBUS_SUBJECT_PREFIX"]) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def services(env: dict[str, str], client: ApprovalClient, bus: Bus) -> AsyncIterator[None]:
    """The registry and the approval service for the whole module (the dispatcher is per test)."""
    async with bus.service("registry", env), bus.service("approval", env):
        yield


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def toolset(services: None, client: ApprovalClient, mcp: McpTestServer) -> str:
    spec = {"mcp": [{"name": "shop", "url": mcp.url, "policies": {"echo": {"approval": True}}}]}
    data = await client.ok(client.subjects.toolsets_create, spec, within=30)
    toolset_id: str = data["id"]
    return toolset_id


async def start_call(client: ApprovalClient, run_id: str, text: str, key: str) -> tuple[str, dict[str, Any]]:
    body = {"runId": run_id, "tool": "shop.echo", "input": {"text": text}, "idempotencyKey": key}
    started = await client.ok(client.subjects.calls_start, body)
    approval = await client.approval_for(started["callId"])
    got = await client.ok(client.subjects.calls_get, {"callId": started["callId"]})
    assert got["state"] == "awaitingApproval"
    call_id: str = started["callId"]
    return call_id, approval


async def outcome_of(client: ApprovalClient, run_id: str, text: str, key: str) -> dict[str, Any]:
    """`calls.invoke` with the same key: the same call, answered once it is done."""
    body = {"runId": run_id, "tool": "shop.echo", "input": {"text": text}, "idempotencyKey": key}
    return await client.ok(client.subjects.calls_invoke, body, within=30)


def show(title: str, events: list[dict[str, Any]]) -> None:
    print(f"\n{title}")
    for event in events:
        extra = {k: v for k, v in event.items() if k not in ("type", "callId", "runId", "at")}
        print(f"  {event['at']}  {event['type']:<18} {json.dumps(extra, sort_keys=True) if extra else ''}")


async def test_approved_call_reaches_the_server_once_and_denied_never(
    env: dict[str, str], client: ApprovalClient, toolset: str, mcp: McpTestServer, bus: Bus
) -> None:
    async with bus.service("dispatcher", env):
        run_id = (await client.ok(client.subjects.runs_open, {"toolsetId": toolset, "namespace": "user-7"}))[
            "runId"
        ]
        before = len(mcp.calls_to("echo"))

        approved_id, approval = await start_call(client, run_id, "refund 5", "key-approve")
        assert approval["tool"] == "shop.echo"
        assert approval["input"] == {"text": "refund 5"}
        assert approval["namespace"] == "user-7"
        assert approval["toolsetId"] == toolset
        listed = await client.approver_ok(client.subjects.approvals_list, {"runId": run_id})
        assert [a["approvalId"] for a in listed["approvals"]] == [approval["approvalId"]]
        assert len(mcp.calls_to("echo")) == before  # nothing is sent before the decision

        decided = await client.approver_ok(
            client.subjects.approvals_decide, {"approvalId": approval["approvalId"], "approve": True}
        )
        assert decided == {"approvalId": approval["approvalId"], "decision": "approved"}
        done = await outcome_of(client, run_id, "refund 5", "key-approve")
        assert done["callId"] == approved_id
        assert done["outcome"] == {"status": "ok", "output": {"text": "refund 5"}}
        sent = mcp.calls_to("echo")[before:]
        assert [(c.arguments, c.idempotency_key_header) for c in sent] == [
            ({"text": "refund 5"}, "key-approve")
        ]

        denied_id, approval = await start_call(client, run_id, "refund 5000", "key-deny")
        decided = await client.approver_ok(
            client.subjects.approvals_decide,
            {"approvalId": approval["approvalId"], "approve": False, "reason": "too large"},
        )
        assert decided["decision"] == "denied"
        done = await outcome_of(client, run_id, "refund 5000", "key-deny")
        assert done["outcome"]["status"] == "error"
        assert done["outcome"]["error"]["code"] == "denied"
        assert "too large" in done["outcome"]["error"]["message"]
        assert len(mcp.calls_to("echo")) == before + 1  # the denied call never reached the server

        again = await request(
            client.approver,
            client.subjects.approvals_decide,
            {"approvalId": approval["approvalId"], "approve": True},
        )
        assert again["error"]["code"] == "conflict"

        approved_kinds = [e["type"] for e in await client.call_events(run_id, approved_id, "completed")]
        denied_kinds = [e["type"] for e in await client.call_events(run_id, denied_id, "completed")]
        assert approved_kinds[:3] == ["accepted", "approvalRequested", "approved"]
        assert approved_kinds[-1] == "completed"
        assert denied_kinds == ["accepted", "approvalRequested", "denied", "completed"]
        events = await client.run_events(run_id)
        show("approved call:", [e for e in events if e["callId"] == approved_id])
        show("denied call:", [e for e in events if e["callId"] == denied_id])


async def test_decision_made_while_the_dispatcher_is_down_takes_effect_when_it_is_back(
    env: dict[str, str], client: ApprovalClient, toolset: str, mcp: McpTestServer, bus: Bus
) -> None:
    async with bus.service("dispatcher", env) as dispatcher:
        run_id = (await client.ok(client.subjects.runs_open, {"toolsetId": toolset}))["runId"]
        before = len(mcp.calls_to("echo"))
        call_id, approval = await start_call(client, run_id, "later", "key-restart")
        dispatcher.kill()  # a crash while the call waits

    decided = await client.approver_ok(
        client.subjects.approvals_decide, {"approvalId": approval["approvalId"], "approve": True}
    )
    assert decided["decision"] == "approved"

    async with bus.service("dispatcher", env):
        done = await outcome_of(client, run_id, "later", "key-restart")
    assert done["callId"] == call_id
    assert done["outcome"] == {"status": "ok", "output": {"text": "later"}}
    sent = mcp.calls_to("echo")[before:]
    assert [c.idempotency_key_header for c in sent] == ["key-restart"]


async def test_closing_the_run_cancels_its_pending_approval(
    env: dict[str, str], client: ApprovalClient, toolset: str, mcp: McpTestServer, bus: Bus
) -> None:
    async with bus.service("dispatcher", env):
        run_id = (await client.ok(client.subjects.runs_open, {"toolsetId": toolset}))["runId"]
        before = len(mcp.calls_to("echo"))
        call_id, approval = await start_call(client, run_id, "closing", "key-close")
        closed = await client.ok(client.subjects.runs_close, {"runId": run_id})
        assert closed["cancelled"] == 1
        got = await client.ok(client.subjects.calls_get, {"callId": call_id})
        assert got["state"] == "done"
        assert got["outcome"]["error"]["code"] == "cancelled"

        for _ in range(400):  # the approval service applies RunClosed from its durable consumer
            listed = await client.approver_ok(client.subjects.approvals_list, {"runId": run_id})
            if not listed["approvals"]:
                break
            await asyncio.sleep(0.025)
        assert listed["approvals"] == []
        late = await request(
            client.approver,
            client.subjects.approvals_decide,
            {"approvalId": approval["approvalId"], "approve": True},
        )
        assert late["error"]["code"] == "conflict"
        assert "run closed" in late["error"]["message"]
        assert len(mcp.calls_to("echo")) == before


async def test_a_harness_cannot_approve_its_own_call(
    env: dict[str, str], client: ApprovalClient, toolset: str, mcp: McpTestServer, bus: Bus
) -> None:
    """The attack an outside probe made on the secured stack: the harness forges the decision
    its own gated call waits for (it knows every field: the approval id from the approver's
    event here, the digest of its own input) and sends it where the dispatcher reads decisions,
    straight and as the answer JetStream gives to a direct get of bytes it chose (an output
    chunk). The call stays gated until an approver decides it; the approver still sees it
    pending; the MCP server is never called."""
    async with bus.service("dispatcher", env):
        run_id = (await client.ok(client.subjects.runs_open, {"toolsetId": toolset}))["runId"]
        before = len(mcp.calls_to("echo"))
        call_id, approval = await start_call(client, run_id, "refund 1000000", "key-self")
        forged = json.dumps(
            {
                "approvalId": approval["approvalId"],
                "callId": call_id,
                "runId": run_id,
                "toolsetId": toolset,
                "tool": "shop.echo",
                "inputDigest": sha256_hex({"text": "refund 1000000"}),
                "decision": "approved",
            }
        ).encode()
        decided_subject = client.subjects.internal_approval_decisions
        bus.attacks.append(decided_subject)
        # Straight (refused by NATS on the secured stack; stored, unsigned, on the open one) ...
        await client.nc.publish(decided_subject, forged)
        # ... and as JetStream's answer to a direct get whose reply subject is the target, of an
        # output chunk holding the forged bytes (a tool the harness registered could return them).
        bucket = js_name(client.prefix, "outputs")
        writer = await bus.connect("dispatcher") if bus.secured else client.nc
        try:
            outputs_js = writer.jetstream()
            store = await ensure_object_store(outputs_js, bucket)
            await store.put(f"forged-{call_id}", forged)
            chunk = await outputs_js.get_last_msg(f"OBJ_{bucket}", f"$O.{bucket}.C.>")
        finally:
            if writer is not client.nc:
                await writer.close()
        await client.nc.publish(
            f"$JS.API.DIRECT.GET.OBJ_{bucket}", json.dumps({"seq": chunk.seq}).encode(), reply=decided_subject
        )
        await client.nc.flush()
        await asyncio.sleep(2.0)
        got = await client.ok(client.subjects.calls_get, {"callId": call_id})
        assert got["state"] == "awaitingApproval"
        listed = await client.approver_ok(client.subjects.approvals_list, {"runId": run_id})
        assert [a["approvalId"] for a in listed["approvals"]] == [approval["approvalId"]]
        assert len(mcp.calls_to("echo")) == before
        decided = await client.approver_ok(
            client.subjects.approvals_decide,
            {"approvalId": approval["approvalId"], "approve": False, "reason": "not yours"},
        )
        assert decided["decision"] == "denied"
        done = await outcome_of(client, run_id, "refund 1000000", "key-self")
        assert done["outcome"]["error"]["code"] == "denied"
        assert len(mcp.calls_to("echo")) == before
        await client.ok(client.subjects.runs_close, {"runId": run_id})
