"""Policies an MCP client sees through the gateway: progress notifications while a call waits
for approval, a denied call as a tool error with the reason, `outcomeUnknown` saying the tool may
have run, and a call parked on expired credentials answered at once with where to renew them."""

from __future__ import annotations

import asyncio
from typing import Any

import mcp_types as types
import pytest

from tests.gateway.conftest import Deployment, mcp_client
from tests.support.mcp_servers import Fault, McpTestServer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def _pending(deployment: Deployment, namespace: str) -> dict[str, Any]:
    for _ in range(300):
        listed = await deployment.ok(deployment.subjects.approvals_list, {"namespace": namespace})
        if listed["approvals"]:
            approval: dict[str, Any] = listed["approvals"][0]
            return approval
        await asyncio.sleep(0.05)
    raise AssertionError(f"no pending approval for {namespace}")


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_approval_sends_progress_until_approved(
    deployment: Deployment, toolset: str, mode: str
) -> None:
    namespace = f"approver-{mode}"
    token = await deployment.token([toolset], namespace=namespace)
    notes: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append((progress, message))

    async with mcp_client(deployment.url(toolset), token, mode=mode) as client:
        call = asyncio.create_task(
            client.call_tool("gated.echo", {"text": "refund 5"}, progress_callback=on_progress)
        )
        approval = await _pending(deployment, namespace)
        assert approval["tool"] == "gated.echo" and approval["input"] == {"text": "refund 5"}
        for _ in range(200):  # two progress notifications while it waits
            if len(notes) >= 2:
                break
            await asyncio.sleep(0.05)
        await deployment.ok(
            deployment.subjects.approvals_decide, {"approvalId": approval["approvalId"], "approve": True}
        )
        result = await asyncio.wait_for(call, 30)
    assert result.is_error is False and result.structured_content == {"text": "refund 5"}
    assert [m for _, m in notes[:2]] == ["awaiting approval", "awaiting approval"]
    assert [p for p, _ in notes] == sorted(p for p, _ in notes)


async def test_denied_call_is_a_tool_error_with_the_reason(deployment: Deployment, toolset: str) -> None:
    token = await deployment.token([toolset], namespace="denied-user")
    async with mcp_client(deployment.url(toolset), token) as client:
        call = asyncio.create_task(client.call_tool("gated.echo", {"text": "refund 5000"}))
        approval = await _pending(deployment, "denied-user")
        await deployment.ok(
            deployment.subjects.approvals_decide,
            {"approvalId": approval["approvalId"], "approve": False, "reason": "too large"},
        )
        result = await asyncio.wait_for(call, 30)
    assert result.is_error is True
    text = result.content[0].text  # type: ignore[union-attr]
    assert text.startswith("denied: the call was not approved, so the tool did not run.")
    assert "too large" in text
    assert result.meta is not None and result.meta["toolbus/error"] == {
        "code": "denied",
        "message": "too large",
    }


async def test_outcome_unknown_says_the_tool_may_have_run(
    deployment: Deployment, toolset: str, mcp_servers: dict[str, McpTestServer]
) -> None:
    token = await deployment.token([toolset])
    mcp_servers["shop"].add_fault(Fault(drop=True))
    async with mcp_client(deployment.url(toolset), token) as client:
        result = await client.call_tool("gated.plain", {"text": "charge once"})
    assert result.is_error is True
    text = result.content[0].text  # type: ignore[union-attr]
    assert text.startswith("outcomeUnknown: the call was interrupted after it was sent")
    assert "may or may not have run" in text


async def test_parked_call_answers_at_once_with_the_reconnect_url(
    deployment: Deployment, mcp_servers: dict[str, McpTestServer]
) -> None:
    spec = {
        "mcp": [{"name": "locked", "url": mcp_servers["locked"].url}],
        "credentials": {"servers": {"locked": {"headers": {"Authorization": "Bearer good"}}}},
    }
    locked = (await deployment.ok(deployment.subjects.toolsets_create, spec, within=60))["id"]
    await deployment.ok(
        deployment.subjects.namespaces_credentials_set,
        {
            "namespace": "expired-user",
            "toolsetId": locked,
            "credentials": {"servers": {"locked": {"headers": {"Authorization": "Bearer stale"}}}},
        },
    )
    token = await deployment.token([locked], namespace="expired-user")
    async with mcp_client(deployment.url(locked), token) as client:
        result = await asyncio.wait_for(client.call_tool("locked.echo", {"text": "hi"}), 10)
    assert result.is_error is True
    text = result.content[0].text  # type: ignore[union-attr]
    assert "credentials for this user have expired" in text
    assert "https://app.example/connect?user=expired-user&server=locked" in text
    assert result.meta is not None
    status = await deployment.ok(deployment.subjects.calls_get, {"callId": result.meta["toolbus/callId"]})
    assert status["state"] == "parked"


async def test_parked_call_asks_for_the_url_and_completes_once_renewed(
    deployment: Deployment, mcp_servers: dict[str, McpTestServer]
) -> None:
    """A 2025-11-25 client that handles URL-mode elicitation is sent the reconnect URL; once the
    user renewed the credentials there (here: the callback sets them) and accepted, the same call
    is sent again and its result is the answer."""
    spec = {
        "mcp": [{"name": "locked", "url": mcp_servers["locked"].url}],
        "credentials": {"servers": {"locked": {"headers": {"Authorization": "Bearer good"}}}},
    }
    locked = (await deployment.ok(deployment.subjects.toolsets_create, spec, within=60))["id"]

    async def set_credentials(token: str) -> None:
        await deployment.ok(
            deployment.subjects.namespaces_credentials_set,
            {
                "namespace": "renewing-user",
                "toolsetId": locked,
                "credentials": {"servers": {"locked": {"headers": {"Authorization": f"Bearer {token}"}}}},
            },
        )

    await set_credentials("stale")
    asked: list[tuple[str | None, str | None]] = []

    async def on_elicit(context: Any, params: Any) -> types.ElicitResult:
        asked.append((getattr(params, "mode", None), getattr(params, "url", None)))
        await set_credentials("good")  # what the user does at the URL
        return types.ElicitResult(action="accept")

    token = await deployment.token([locked], namespace="renewing-user")
    async with mcp_client(deployment.url(locked), token, mode="legacy", elicitation=on_elicit) as client:
        result = await asyncio.wait_for(client.call_tool("locked.echo", {"text": "after renewal"}), 30)
    assert asked == [("url", "https://app.example/connect?user=renewing-user&server=locked")]
    assert result.is_error is False and result.structured_content == {"text": "after renewal"}
