"""Every public method of the SDK's client against the real services: toolsets, declarations,
search, credentials at three levels, workflows, runs and calls (waiting, with a handle, events),
approvals (listed, approved, denied, followed as they arrive)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from toolbus import (
    CallHandle,
    CallResult,
    Denied,
    InvalidInput,
    NotFound,
    Run,
    Toolbus,
    ToolError,
    Toolset,
    UnknownTool,
)
from toolbus_contracts import ApprovalRequested, CallEvent

from tests.support.infra import until
from tests.support.mcp_servers import McpTestServer

pytestmark = pytest.mark.e2e


async def _toolset(tb: Toolbus, server: McpTestServer, **policies: Any) -> Toolset:
    return await tb.toolsets.create(mcp=[{"name": "everything", "url": server.url, "policies": policies}])


async def test_toolsets_create_get_declarations_search(tb: Toolbus, mcp_server: McpTestServer) -> None:
    toolset = await tb.toolsets.create(
        mcp=[{"name": "everything", "url": mcp_server.url}], http={"allow": ["127.0.0.1"]}
    )
    assert toolset.id.startswith("ts_") and len(toolset.id) == 67
    assert {"everything.echo", "everything.fail", "http.fetch"} <= set(toolset.names)
    assert toolset.tool("everything.echo").kind == "mcp"
    assert toolset.tool("everything.echo").policy.on_interruption == "retry"
    assert toolset.declarations is not None
    assert "everything.echo" in toolset.declarations.prompt
    assert "namespace everything" in toolset.declarations.dts or "everything" in toolset.declarations.dts

    again = await tb.toolsets.get(toolset.id)
    assert again.id == toolset.id and again.names == toolset.names and again.declarations is None
    assert await tb.toolsets.declarations(toolset, "prompt") == toolset.declarations.prompt
    assert await tb.toolsets.declarations(toolset.id, "dts") == toolset.declarations.dts

    hits = await tb.toolsets.search(toolset, "always report a tool error", limit=2)
    assert 1 <= len(hits) <= 2
    assert hits[0].name == "everything.fail"
    assert hits[0].score >= hits[-1].score
    assert (await tb.toolsets.search_reply(toolset, "always report a tool error")).ranking is not None
    vectors = (await tb.toolsets.get(toolset.id)).vectors  # once searched, this replica holds the index
    assert vectors is not None and vectors.tools == len(toolset.names) and 0 <= vectors.ready <= vectors.tools

    with pytest.raises(NotFound) as info:
        await tb.toolsets.get("ts_" + "0" * 64)
    assert info.value.code == "notFound" and not info.value.retryable


async def test_run_call_invoke_start_events_close(tb: Toolbus, mcp_server: McpTestServer) -> None:
    toolset = await _toolset(tb, mcp_server)
    async with await tb.runs.open(toolset, namespace="user-42") as run:
        assert isinstance(run, Run) and run.toolset_id == toolset.id
        assert await run.call("everything.echo", {"text": "hi"}) == {"text": "hi"}

        result = await run.invoke("everything.echo", {"text": "again"}, idempotency_key="k-1")
        assert isinstance(result, CallResult) and result.ok and result.output == {"text": "again"}
        assert result.idempotency_key == "k-1"
        same = await run.invoke("everything.echo", {"text": "again"}, idempotency_key="k-1")
        assert same.call_id == result.call_id

        handle = await run.start("everything.echo", {"text": "later"})
        assert isinstance(handle, CallHandle)
        assert await handle == {"text": "later"}
        status = await handle.status()
        assert status.state == "done" and status.attempts == 1
        assert status.result is not None and status.result.output == {"text": "later"}
        assert (await tb.runs.call_status(handle.call_id)).state == "done"
        kinds = [e.type async for e in handle.events(follow=False)]
        assert kinds[0] == "accepted" and kinds[-1] == "completed"

        with pytest.raises(ToolError) as failed:
            await run.call("everything.fail", {"text": "x"})
        assert "failed on purpose" in failed.value.message
        assert failed.value.details["callId"]

        with pytest.raises(UnknownTool):
            await run.call("everything.nope", {})
        with pytest.raises(InvalidInput):
            await run.call("everything.echo", {"text": 5})

        # A call's `completed` event is relayed just after its reply: a replay at once may end
        # before the last one (docs/protocol.md, Events), so replay until it is there.
        events: list[CallEvent] = []

        async def all_completed() -> bool:
            events[:] = [e async for e in run.events(follow=False)]
            return sum(e.type == "completed" for e in events) >= 4

        await until(all_completed, "the four calls' completed events in the stream")
        assert all(isinstance(e, CallEvent) and e.run_id == run.id for e in events)
        completed = [e for e in events if e.type == "completed"]
        assert len(completed) == 4  # echo, invoke k-1 (once), start, fail
    with pytest.raises(NotFound):
        await run.call("everything.echo", {"text": "closed"})


async def test_events_follow_sees_a_call_made_after_it_started(
    tb: Toolbus, mcp_server: McpTestServer
) -> None:
    toolset = await _toolset(tb, mcp_server)
    run = await tb.runs.open(toolset)
    seen: list[str] = []

    async def follow() -> None:
        async for event in run.events(follow=True):
            seen.append(event.type)
            if event.type == "completed":
                return

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0)
    await run.call("everything.echo", {"text": "live"})
    await asyncio.wait_for(follower, 20)
    assert seen[0] == "accepted" and seen[-1] == "completed"
    assert await run.close() == 0


async def test_credentials_at_three_levels_and_workflows(tb: Toolbus) -> None:
    token = "tok-sdk-levels"
    async with McpTestServer(name="crm", required_token=token) as server:
        creds = {"servers": {"crm": {"headers": {"Authorization": f"Bearer {token}"}}}}
        toolset = await tb.toolsets.create(mcp=[{"name": "crm", "url": server.url}], credentials=creds)
        assert await tb.toolsets.set_credentials(toolset, creds) == "toolset"
        assert await tb.namespaces.set_credentials("user-7", toolset, creds) == "namespace"
        async with await tb.runs.open(toolset, namespace="user-7") as run:
            assert await run.set_credentials(creds) == "run"
            assert await run.call("crm.echo", {"text": "auth"}) == {"text": "auth"}
        assert all(c.authorized for c in server.calls)

    schema = {"type": "object", "properties": {"issue": {"type": "string"}}, "required": ["issue"]}
    version = await tb.workflows.publish("triage_sdk", input_schema=schema, description="Triage an issue.")
    assert len(version) == 12
    assert (
        await tb.workflows.publish("triage_sdk", input_schema=schema, description="Triage an issue.")
        == version
    )
    latest = await tb.workflows.get("triage_sdk")
    assert latest.version == version and latest.input_schema == schema
    assert (await tb.workflows.get("triage_sdk", version)).name == "triage_sdk"

    derived = await tb.toolsets.create(base=toolset, workflows=[f"triage_sdk@{version}"])
    assert derived.id != toolset.id
    assert set(derived.names) == {*toolset.names, "workflows.triage_sdk"}


async def test_approvals_list_approve_deny_and_requests(tb: Toolbus, mcp_server: McpTestServer) -> None:
    toolset = await _toolset(tb, mcp_server, echo={"approval": True})
    run = await tb.runs.open(toolset, namespace="approver-test")
    # an async generator: closed with aclose() once done with it
    stream = tb.approvals.requests(run_id=run.id)
    first = await run.start("everything.echo", {"text": "approve me"})
    request = await asyncio.wait_for(anext(stream), 20)
    assert isinstance(request, ApprovalRequested)
    assert request.call_id == first.call_id and request.tool == "everything.echo"
    assert request.input == {"text": "approve me"}

    listed = await tb.approvals.list(run_id=run.id)
    assert [a.approval_id for a in listed] == [request.approval_id]
    assert (await tb.approvals.list(namespace="approver-test"))[0].call_id == first.call_id
    assert await tb.approvals.approve(request.approval_id) == "approved"
    assert await first.result(timeout=20) == {"text": "approve me"}

    second = await run.start("everything.echo", {"text": "deny me"})
    denied_request = await asyncio.wait_for(anext(stream), 20)
    assert denied_request.call_id == second.call_id
    assert await tb.approvals.deny(denied_request.approval_id, reason="not today") == "denied"
    with pytest.raises(Denied) as info:
        await second.result(timeout=20)
    assert "not today" in info.value.message
    await stream.aclose()
    await run.close()
