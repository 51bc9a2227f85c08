"""Every contract error code becomes its own exception class under `ToolbusError`, with code,
message, details and retryable: each code from the wire, and each one the real services can be
made to answer, provoked for real."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
from toolbus import (
    ERRORS,
    Cancelled,
    Conflict,
    CredentialsRejected,
    ErrorCode,
    HostNotAllowed,
    InvalidRequest,
    OutcomeUnknown,
    Timeout,
    Toolbus,
    ToolbusError,
    Unavailable,
    UpstreamError,
    UpstreamUnreachable,
    Worker,
    host_tool,
)
from toolbus._errors import error_from_wire

from tests.support.infra import free_port
from tests.support.mcp_servers import Fault, McpTestServer

RETRYABLE = {ErrorCode.UPSTREAM_UNREACHABLE, ErrorCode.TIMEOUT, ErrorCode.UNAVAILABLE}


@pytest.mark.parametrize("code", list(ErrorCode))
def test_each_wire_code_becomes_its_own_exception_class(code: ErrorCode) -> None:
    exc = error_from_wire(
        {"code": code.value, "message": "It went wrong.", "details": {"field": "x"}}, callId="c1"
    )
    assert type(exc) is ERRORS[code]
    assert isinstance(exc, ToolbusError)
    assert exc.code is code
    assert exc.message == "It went wrong."
    assert exc.details == {"field": "x", "callId": "c1"}
    assert exc.retryable is (code in RETRYABLE)
    assert type(exc).__name__[0].isupper()


def test_the_mapping_covers_every_code_once_and_unknown_codes_are_internal() -> None:
    assert set(ERRORS) == set(ErrorCode)
    assert len(set(ERRORS.values())) == len(ErrorCode)
    assert error_from_wire({"code": "somethingNew", "message": "?"}).code is ErrorCode.INTERNAL
    assert error_from_wire("not an object").code is ErrorCode.INTERNAL


pytestmark_e2e = pytest.mark.e2e


@pytestmark_e2e
async def test_codes_provoked_against_the_real_services(tb: Toolbus, mcp_server: McpTestServer) -> None:
    # invalidRequest, answered by the registry itself (the SDK's own check is bypassed).
    with pytest.raises(InvalidRequest) as bad:
        await tb.request(tb.subjects.toolsets_get, {"id": 5})
    assert bad.value.details.get("field") == "id"
    # upstreamUnreachable: registration cannot reach the server (retryable).
    with pytest.raises(UpstreamUnreachable) as unreachable:
        await tb.toolsets.create(mcp=[{"name": "gone", "url": f"http://127.0.0.1:{free_port()}/mcp"}])
    assert unreachable.value.retryable
    # credentialsRejected: the server answers 401 at registration.
    async with McpTestServer(name="locked", required_token="nope-token") as locked:
        with pytest.raises(CredentialsRejected):
            await tb.toolsets.create(mcp=[{"name": "locked", "url": locked.url}])

    toolset = await tb.toolsets.create(
        mcp=[
            {
                "name": "everything",
                "url": mcp_server.url,
                "policies": {
                    "plain": {"timeout": "300ms", "onInterruption": "at_most_once"},
                    "echo": {"approval": True},
                },
            }
        ],
        http={"allow": ["127.0.0.1"]},
    )
    run = await tb.runs.open(toolset, run_id=f"errors-{free_port()}")
    # conflict: the same run id with another toolset.
    other = await tb.toolsets.create(mcp=[{"name": "other", "url": mcp_server.url}])
    with pytest.raises(Conflict):
        await tb.runs.open(other, run_id=run.id)
    # hostNotAllowed: http.fetch to a host that is not on the allow list.
    with pytest.raises(HostNotAllowed):
        await run.call("http.fetch", {"url": "http://example.org/"})
    # upstreamError: the server answers 500.
    mcp_server.add_fault(Fault(status=500))
    with pytest.raises(UpstreamError):
        await run.call("everything.fail", {"text": "500"})
    # outcomeUnknown: at_most_once and no answer within the timeout.
    mcp_server.add_fault(Fault(hang=True))
    with pytest.raises(OutcomeUnknown):
        await run.call("everything.plain", {"text": "hang"})
    # cancelled: a call waiting for approval when its run closes.
    waiting = await run.start("everything.echo", {"text": "never approved"})
    assert await run.close() == 1
    with pytest.raises(Cancelled):
        await waiting.result(timeout=20)
    # unavailable: no service answers under this prefix (sent again until the 2 s timeout is spent,
    # then the last `Unavailable` is raised); timeout: a handle that is not done in time.
    nobody_prefix = f"tbnobody{free_port()}"
    connected = tb.nc.connected_url
    assert connected is not None
    async with await Toolbus.connect(connected.geturl(), nobody_prefix, timeout=2) as nobody:
        with pytest.raises(Unavailable) as down:
            await nobody.toolsets.get("ts_" + "0" * 64)
        assert down.value.retryable and "toolbus up" in down.value.message
    run2 = await tb.runs.open(toolset)
    slow = await run2.start("everything.echo", {"text": "awaiting approval"})
    with pytest.raises(Timeout):
        await slow.wait(timeout=0.5)
    await run2.close()


@pytestmark_e2e
async def test_connect_to_a_server_that_is_not_there_is_unavailable() -> None:
    with pytest.raises(Unavailable) as info:
        await Toolbus.connect(f"nats://127.0.0.1:{free_port()}", connect_timeout=1)
    assert info.value.retryable and "Could not connect" in info.value.message


@pytestmark_e2e
async def test_a_request_on_a_closed_client_is_unavailable_not_a_nats_error(
    stack: dict[str, str], mcp_server: McpTestServer
) -> None:
    async with await Toolbus.connect(stack["TOOLBUS_NATS_URL"], stack["TOOLBUS_SUBJECT_PREFIX"]) as tb:
        toolset = await tb.toolsets.create(mcp=[{"name": "e", "url": mcp_server.url}])
        run = await tb.runs.open(toolset)
        handle = await run.start("e.echo", {"text": "x"})
        await handle.wait(timeout=10)
        # Waits under way when the client is closed end the same way (nats-py wakes none of them).
        expired = await tb.credentials_expired(toolset_id=toolset.id)  # subscribed once it returns
        following = run.events(follow=True)
        assert (await anext(following)).type == "accepted"  # subscribed, reading the stream
        waiting = [
            asyncio.create_task(_drain(following)),
            asyncio.create_task(expired.next()),
            asyncio.create_task(_first(tb.approvals.requests(run_id=run.id))),
        ]
        await asyncio.sleep(1.0)  # the approvals feed lists the pending ones first: one request
        assert not any(task.done() for task in waiting)

    @host_tool
    async def nothing() -> str:
        """Does nothing."""
        return ""

    async def approvals() -> None:
        await _first(tb.approvals.requests())

    requests: list[Callable[[], Awaitable[object]]] = [
        lambda: tb.runs.open(toolset),
        lambda: run.call("e.echo", {"text": "x"}),
        lambda: handle.wait(timeout=5),
        lambda: _drain(run.events(follow=False)),
        approvals,
        lambda: tb.credentials_expired(),
        lambda: Worker(tb, tools=[nothing]).start(),
        *(functools.partial(asyncio.shield, task) for task in waiting),
    ]
    for request in requests:
        with pytest.raises(Unavailable) as info:
            await asyncio.wait_for(request(), 5)  # well within: a hang fails here, not at the timeout
        assert info.value.details["closed"] is True and not info.value.retryable
        assert "closed" in info.value.message


async def _drain(events: Any) -> None:
    async for _ in events:
        pass


async def _first(events: Any) -> Any:
    async for event in events:
        return event
    return None


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"a": float("nan")}, "input.a"),
        ({"a": [1, float("inf")]}, "input.a[1]"),
        ({"a": 2**70}, "input.a"),
        # Tuples and sets are written as arrays: what is in them is looked at too.
        ({"a": (1, float("nan"))}, "input.a[1]"),
        ({"a": {"b": (2**70,)}}, "input.a.b[0]"),
        ({"a": frozenset([float("-inf")])}, "input.a[0]"),
    ],
)
def test_numbers_json_cannot_carry_are_invalid_request_before_sending(
    value: dict[str, Any], field: str
) -> None:
    """orjson and pydantic would write NaN and infinity as null and refuse 2**70: the SDK says so."""
    from toolbus._runs import Run

    run = Run(cast(Any, None), "run_1", None, None)
    with pytest.raises(InvalidRequest) as caught:
        run._body("a.b", value, None)
    assert caught.value.details == {"field": field}


@pytest.mark.parametrize("value", [[1, 2], "{}", 5])
def test_an_input_that_is_not_a_mapping_is_invalid_request(value: Any) -> None:
    from toolbus._runs import Run

    run = Run(cast(Any, None), "run_1", None, None)
    with pytest.raises(InvalidRequest) as caught:
        run._body("a.b", value, None)
    assert caught.value.details == {"field": "input"}


@pytest.mark.parametrize(
    ("credentials", "field"),
    [
        ({"servers": {"gh": {"headers": {"X-Token": 5}}}}, "credentials.servers.gh.headers.X-Token"),
        ({"servers": {"gh": {"hdrs": {}}}}, "credentials.servers.gh.hdrs"),
        ({"servers": 5}, "credentials.servers"),
    ],
)
def test_bad_credentials_are_named_from_the_request_root_as_the_service_names_them(
    credentials: dict[str, Any], field: str
) -> None:
    from toolbus._runs import Run
    from toolbus._toolsets import Namespaces, Toolsets

    tb = cast(Any, None)
    ts = "ts_" + "0" * 64
    for setting in (
        Toolsets(tb).set_credentials(ts, credentials),
        Namespaces(tb).set_credentials("ann", ts, credentials),
        Run(tb, "run_1", None, None).set_credentials(credentials),
    ):
        with pytest.raises(InvalidRequest) as caught:
            asyncio.run(setting)
        assert caught.value.details == {"field": field}
