"""Approvals a person decides on, end to end: the registry, the dispatcher and the approval service
as processes, a real MCP server, a harness and an approver each on their own NATS role.

Proves: an approval rule asks only for the calls it matches (input, run namespace), and asks when
it cannot be evaluated, saying why; the rule is part of the toolset's id; an edited input is
checked against the tool's schema (invalid: `invalidRequest` naming `input`, nothing decided),
sent instead of the asked one, and both digests are in the `approved` event; every decision names
its decider (the NATS user, vouched for by the server, under the accounts configuration; the
client's `decider`, marked `claimed:`, without it); `approvals.history` filters and pages them; a
tool's `approvalTimeout` denies its call `expired` on its own clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from toolbus_common.canonical import sha256_hex

from tests.support.approvals import ApprovalClient, approval_client
from tests.support.bus_modes import Bus
from tests.support.infra import request
from tests.support.mcp_servers import McpTestServer

pytestmark = pytest.mark.e2e

ECHO_RULE = {"when": {"properties": {"input": {"properties": {"text": {"pattern": "^refund"}}}}}}
"""`shop.echo` asks when its text starts with `refund`."""
FAIL_RULE = {"when": {"properties": {"run": {"properties": {"namespace": {"const": "prod"}}}}}}
"""`shop.fail` asks in the namespace `prod` only."""
PLAIN_RULE = {"when": {"$ref": "https://rules.example.invalid/plain.json"}}
"""A valid schema that cannot be evaluated: toolbus fetches no reference."""


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def mcp() -> AsyncIterator[McpTestServer]:
    async with McpTestServer(name="shop") as server:
        yield server


@pytest.fixture(scope="module")
def env(service_env: dict[str, str], bus: Bus) -> dict[str, str]:
    prefix = bus.prefix("tbad")
    env = {
        **service_env,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_REDIS_PREFIX": prefix,
        "TOOLBUS_LOG_LEVEL": "WARNING",
        "TOOLBUS_APPROVAL_SWEEP_INTERVAL": "0.2",
    }
    if bus.secured:  # as `make up TOOLBUS_SECURE=1` sets it: the server vouches for the header
        env["TOOLBUS_APPROVAL_TRUST_REQUEST_INFO"] = "1"
    return env


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def client(env: dict[str, str], bus: Bus, redis_url: str) -> AsyncIterator[ApprovalClient]:
    async with approval_client(bus, redis_url, env["TOOLBUS_SUBJECT_PREFIX"]) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def services(env: dict[str, str], client: ApprovalClient, bus: Bus) -> AsyncIterator[None]:
    async with bus.service("registry", env), bus.service("approval", env), bus.service("dispatcher", env):
        yield


def spec(mcp: McpTestServer, echo_rule: dict[str, Any] = ECHO_RULE) -> dict[str, Any]:
    policies = {
        "echo": {"approval": echo_rule},
        "fail": {"approval": FAIL_RULE},
        "plain": {"approval": PLAIN_RULE, "approvalTimeout": "1s"},
    }
    return {"mcp": [{"name": "shop", "url": mcp.url, "policies": policies}]}


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def toolset(services: None, client: ApprovalClient, mcp: McpTestServer) -> str:
    data = await client.ok(client.subjects.toolsets_create, spec(mcp), within=30)
    toolset_id: str = data["id"]
    return toolset_id


async def open_run(client: ApprovalClient, toolset: str, namespace: str) -> str:
    data = await client.ok(client.subjects.runs_open, {"toolsetId": toolset, "namespace": namespace})
    run_id: str = data["runId"]
    return run_id


async def start(client: ApprovalClient, run_id: str, tool: str, text: str, key: str) -> str:
    body = {"runId": run_id, "tool": tool, "input": {"text": text}, "idempotencyKey": key}
    call_id: str = (await client.ok(client.subjects.calls_start, body))["callId"]
    return call_id


async def invoke(client: ApprovalClient, run_id: str, tool: str, text: str, key: str) -> dict[str, Any]:
    body = {"runId": run_id, "tool": tool, "input": {"text": text}, "idempotencyKey": key}
    return await client.ok(client.subjects.calls_invoke, body, within=30)


async def test_a_rule_asks_for_the_calls_it_matches_only(
    client: ApprovalClient, toolset: str, mcp: McpTestServer
) -> None:
    run_id = await open_run(client, toolset, "dev")
    # Not matching: sent at once, no approval.
    done = await invoke(client, run_id, "shop.echo", "hello", "no-rule-match")
    assert done["outcome"] == {"status": "ok", "output": {"text": "hello"}}
    events = await client.call_events(run_id, done["callId"], "completed")
    assert "approvalRequested" not in [e["type"] for e in events]
    # Matching the input: waits for a decision.
    call_id = await start(client, run_id, "shop.echo", "refund 5", "rule-match")
    approval = await client.approval_for(call_id)
    assert approval["tool"] == "shop.echo" and "ruleError" not in approval
    got = await client.ok(client.subjects.calls_get, {"callId": call_id})
    assert got["state"] == "awaitingApproval"
    denied = await client.decide({"approvalId": approval["approvalId"], "approve": False, "decider": "alice"})
    assert denied["ok"] is True, denied
    # A rule on the run: `shop.fail` asks in `prod`, not in `dev`.
    done = await invoke(client, run_id, "shop.fail", "x", "fail-dev")
    assert done["outcome"]["status"] == "error" and done["outcome"]["error"]["code"] != "denied"
    prod = await open_run(client, toolset, "prod")
    call_id = await start(client, prod, "shop.fail", "x", "fail-prod")
    approval = await client.approval_for(call_id)
    assert approval["namespace"] == "prod"
    await client.decide({"approvalId": approval["approvalId"], "approve": False})


async def test_a_rule_that_cannot_be_evaluated_asks_and_the_tool_timeout_expires_it(
    client: ApprovalClient, toolset: str
) -> None:
    run_id = await open_run(client, toolset, "dev")
    call_id = await start(client, run_id, "shop.plain", "anything", "unevaluable")
    approval = await client.approval_for(call_id)
    assert "https://rules.example.invalid/plain.json" in approval["ruleError"]
    # `plain`'s own approvalTimeout (1s; the service has none) denies it `expired`.
    events = await client.call_events(run_id, call_id, "completed")
    denied = next(e for e in events if e["type"] == "denied")
    assert denied["reason"] == "expired"
    assert denied["decider"] == "toolbus:expiry"
    assert events[-1]["outcome"]["error"]["code"] == "denied"


async def test_the_rule_is_part_of_the_toolset_id(
    client: ApprovalClient, toolset: str, mcp: McpTestServer
) -> None:
    other_rule = {"when": {"properties": {"input": {"properties": {"text": {"pattern": "^pay"}}}}}}
    again = await client.ok(client.subjects.toolsets_create, spec(mcp), within=30)
    other = await client.ok(client.subjects.toolsets_create, spec(mcp, other_rule), within=30)
    assert again["id"] == toolset
    assert other["id"] != toolset
    tools = {t["name"]: t for t in (await client.ok(client.subjects.toolsets_get, {"id": toolset}))["tools"]}
    assert tools["shop.echo"]["policy"]["approval"] == ECHO_RULE
    assert tools["shop.plain"]["policy"]["approvalTimeout"] == "1s"
    bad = {"when": {"type": "no-such-type"}}
    refused = await request(client.nc, client.subjects.toolsets_create, spec(mcp, bad), timeout=30)
    assert refused["ok"] is False
    assert refused["error"]["code"] == "invalidRequest"
    assert refused["error"]["details"]["field"] == "mcp[0].policies.echo.approval.when"


async def test_an_edited_input_is_checked_sent_and_both_digests_recorded(
    client: ApprovalClient, toolset: str, mcp: McpTestServer, bus: Bus
) -> None:
    run_id = await open_run(client, toolset, "dev")
    key = f"edit-me-{bus.mode}"  # the MCP server outlives a mode: its records are of both
    call_id = await start(client, run_id, "shop.echo", "refund 5000", key)
    approval = await client.approval_for(call_id)

    invalid = await client.decide(
        {"approvalId": approval["approvalId"], "approve": True, "input": {"text": 5}}
    )
    assert invalid["ok"] is False
    assert invalid["error"]["code"] == "invalidRequest"
    assert invalid["error"]["details"] == {"field": "input", "path": "$.text"}
    huge = b'{"approvalId": "%s", "approve": true, "input": {"text": 1180591620717411303424}}'
    unfit = await request(
        client.approver, client.subjects.approvals_decide, huge % approval["approvalId"].encode()
    )
    assert unfit["ok"] is False and unfit["error"]["details"] == {"field": "input.text"}
    too_large = await client.decide(
        {
            "approvalId": approval["approvalId"],
            "approve": True,
            "input": {"text": "x" * (client.approver.max_payload - 10_000)},
        }
    )
    assert too_large["ok"] is False and too_large["error"]["details"]["field"] == "input"
    got = await client.ok(client.subjects.calls_get, {"callId": call_id})
    assert got["state"] == "awaitingApproval"  # nothing was decided

    edited = {"text": "refund 50"}
    decided = await client.decide(
        {"approvalId": approval["approvalId"], "approve": True, "input": edited, "decider": "alice"}
    )
    assert decided["ok"] is True, decided
    assert decided["data"]["editedInputDigest"] == sha256_hex(edited)
    done = await invoke(client, run_id, "shop.echo", "refund 5000", key)  # same key, asked input
    assert done["callId"] == call_id
    assert done["outcome"] == {"status": "ok", "output": {"text": "refund 50"}}
    assert [c.arguments for c in mcp.calls_to("echo") if c.idempotency_key_header == key] == [edited]
    events = await client.call_events(run_id, call_id, "completed")
    approved = next(e for e in events if e["type"] == "approved")
    assert approved["inputDigest"] == sha256_hex({"text": "refund 5000"})
    assert approved["editedInputDigest"] == sha256_hex(edited)
    assert approved["decider"] == expected_decider(bus, "alice")


def expected_decider(bus: Bus, claimed: str) -> str:
    """Secured: the approver's NATS user, from the header nats-server adds (the claim ignored)."""
    return "nats:APPROVER/approver" if bus.secured else f"claimed:{claimed}"


async def test_history_lists_decisions_with_their_deciders_filtered_and_paged(
    client: ApprovalClient, toolset: str, bus: Bus
) -> None:
    run_id = await open_run(client, toolset, "hist")
    ids = []
    for i, approve in enumerate([True, False, True]):
        call_id = await start(client, run_id, "shop.echo", f"refund {i}", f"hist-{i}")
        approval = await client.approval_for(call_id)
        body = {"approvalId": approval["approvalId"], "approve": approve, "decider": "bob"}
        assert (await client.decide(body))["ok"] is True
        ids.append(approval["approvalId"])

    page = await client.history(namespace="hist")
    assert [d["approvalId"] for d in page["decisions"]] == ids[::-1]  # newest first
    assert {d["decider"] for d in page["decisions"]} == {expected_decider(bus, "bob")}
    assert [d["decision"] for d in page["decisions"]] == ["approved", "denied", "approved"]
    assert page["decisions"][0]["toolsetId"] == toolset and page["decisions"][0]["tool"] == "shop.echo"

    denied = await client.history(namespace="hist", outcome="denied")
    assert [d["approvalId"] for d in denied["decisions"]] == [ids[1]]
    by_decider = await client.history(
        namespace="hist", decider=expected_decider(bus, "bob"), tool="shop.echo"
    )
    assert len(by_decider["decisions"]) == 3
    assert (await client.history(namespace="hist", decider="nobody"))["decisions"] == []
    assert (await client.history(namespace="hist", toolsetId="ts_" + "0" * 64))["decisions"] == []

    seen = []
    cursor = None
    while True:
        page_body: dict[str, Any] = {"namespace": "hist", "limit": 1}
        if cursor:
            page_body["cursor"] = cursor
        page = await client.history(**page_body)
        seen += [d["approvalId"] for d in page["decisions"]]
        cursor = page.get("nextCursor")
        if not cursor:
            break
    assert seen == ids[::-1]

    since = (await client.history(namespace="hist"))["decisions"][1]["decidedAt"]  # ids[1]'s
    recent = await client.history(namespace="hist", since=since)
    assert [d["approvalId"] for d in recent["decisions"]] == [ids[2], ids[1]]  # since: inclusive
    older = await client.history(namespace="hist", until=since)
    assert [d["approvalId"] for d in older["decisions"]] == [ids[0]]  # until: exclusive
    bad = await request(
        client.approver, client.subjects.approvals_history, {"since": "yesterday"}, timeout=10
    )
    assert bad["ok"] is False and bad["error"]["details"] == {"field": "since"}


async def remembered(client: ApprovalClient, **filters: Any) -> list[dict[str, Any]]:
    reply = await request(client.approver, client.subjects.approvals_remembered_list, filters, timeout=10)
    assert reply["ok"] is True, reply
    found: list[dict[str, Any]] = reply["data"]["remembered"]
    return found


async def test_a_remembered_decision_decides_at_once_until_revoked(
    client: ApprovalClient, toolset: str, bus: Bus
) -> None:
    run_id = await open_run(client, toolset, "mem")
    approval = await client.approval_for(await start(client, run_id, "shop.echo", "refund 1", "mem-0"))
    reply = await client.decide(
        {"approvalId": approval["approvalId"], "approve": True, "remember": {"for": "1h"}, "decider": "carol"}
    )
    assert reply["ok"] is True, reply
    remembered_id = reply["data"]["rememberedId"]

    # Used: a later call of the namespace and tool, another input, is approved at once.
    done = await invoke(client, run_id, "shop.echo", "refund 2", "mem-1")
    assert done["outcome"] == {"status": "ok", "output": {"text": "refund 2"}}
    events = await client.call_events(run_id, done["callId"], "completed")
    approved = next(e for e in events if e["type"] == "approved")
    assert approved["decider"] == f"remembered:{remembered_id}"  # the event says so
    history = await client.history(namespace="mem", decider=f"remembered:{remembered_id}")
    assert [d["callId"] for d in history["decisions"]] == [done["callId"]]

    listed = await remembered(client, namespace="mem")
    assert [(r["rememberedId"], r["tool"], r["decision"], r["decider"]) for r in listed] == [
        (remembered_id, "shop.echo", "approved", expected_decider(bus, "carol"))
    ]
    assert "inputDigest" not in listed[0] and listed[0]["approvalId"] == approval["approvalId"]
    assert await remembered(client, namespace="mem", tool="shop.fail") == []

    # Another namespace is not covered.
    other = await open_run(client, toolset, "mem-other")
    approval = await client.approval_for(await start(client, other, "shop.echo", "refund 3", "mem-2"))
    assert (await client.decide({"approvalId": approval["approvalId"], "approve": False}))["ok"] is True

    # Revoked: the next call asks a person again; a second revoke is notFound.
    revoke = client.subjects.approvals_remembered_revoke
    assert (await request(client.approver, revoke, {"rememberedId": remembered_id}, timeout=10))["ok"] is True
    again = await request(client.approver, revoke, {"rememberedId": remembered_id}, timeout=10)
    assert again["ok"] is False and again["error"]["code"] == "notFound"
    assert await remembered(client, namespace="mem") == []
    call_id = await start(client, run_id, "shop.echo", "refund 4", "mem-3")
    approval = await client.approval_for(call_id)
    assert (await client.decide({"approvalId": approval["approvalId"], "approve": False}))["ok"] is True


async def test_a_remembered_denial_of_one_input_expires(client: ApprovalClient, toolset: str) -> None:
    run_id = await open_run(client, toolset, "mem-input")
    approval = await client.approval_for(await start(client, run_id, "shop.echo", "refund 9", "mi-0"))
    body = {
        "approvalId": approval["approvalId"],
        "approve": False,
        "reason": "not this one",
        "remember": {"for": "2s", "sameInput": True},
    }
    reply = await client.decide(body)
    assert reply["ok"] is True, reply
    listed = await remembered(client, namespace="mem-input")
    assert listed[0]["inputDigest"] == sha256_hex({"text": "refund 9"})

    done = await invoke(client, run_id, "shop.echo", "refund 9", "mi-1")  # the same input: denied at once
    assert done["outcome"]["error"] == {"code": "denied", "message": "not this one"}
    approval = await client.approval_for(await start(client, run_id, "shop.echo", "refund 10", "mi-2"))
    assert (await client.decide({"approvalId": approval["approvalId"], "approve": True}))["ok"] is True

    await asyncio.sleep(2.2)  # expired: the same input asks a person again
    assert await remembered(client, namespace="mem-input") == []
    approval = await client.approval_for(await start(client, run_id, "shop.echo", "refund 9", "mi-3"))
    assert (await client.decide({"approvalId": approval["approvalId"], "approve": True}))["ok"] is True

    bad = await client.decide(
        {"approvalId": approval["approvalId"], "approve": True, "remember": {"for": "365d"}}
    )
    assert bad["ok"] is False and bad["error"]["details"] == {"field": "remember.for"}


async def test_the_sdk_edits_remembers_revokes_and_reads_the_history(
    client: ApprovalClient, toolset: str, bus: Bus
) -> None:
    from toolbus import Toolbus
    from toolbus._connection import ConnectOptions

    options = ConnectOptions.from_env({**bus.role_env("approver"), "TOOLBUS_SUBJECT_PREFIX": client.prefix})
    run_id = await open_run(client, toolset, "sdk")
    approval = await client.approval_for(await start(client, run_id, "shop.echo", "refund 70", "sdk-0"))
    async with await Toolbus.connect(options=options) as tb:
        decided = await tb.approvals.decide(
            approval["approvalId"], True, decider="dana", input={"text": "refund 7"}
        )
        assert decided == "approved"
        done = await invoke(client, run_id, "shop.echo", "refund 70", "sdk-0")
        assert done["outcome"] == {"status": "ok", "output": {"text": "refund 7"}}

        approval = await client.approval_for(await start(client, run_id, "shop.echo", "refund 8", "sdk-1"))
        assert await tb.approvals.decide(approval["approvalId"], False, "no", remember_for="1h") == "denied"
        (kept,) = await tb.approvals.remembered(namespace="sdk")
        assert kept.decision == "denied" and kept.reason == "no"
        await tb.approvals.revoke(kept.remembered_id)
        assert await tb.approvals.remembered(namespace="sdk") == []

        page = await tb.approvals.history(namespace="sdk")
        assert [d.decision for d in page.decisions] == ["denied", "approved"]
        assert page.decisions[1].edited_input_digest == sha256_hex({"text": "refund 7"})
        assert page.decisions[1].decider == expected_decider(bus, "dana")
