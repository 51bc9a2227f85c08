"""The contracts library: bodies refuse what the contract refuses and name the field; errors
survive the wire; durations parse as the contract writes them."""

from __future__ import annotations

import json
import types
from datetime import timedelta
from typing import Any

import orjson
import pytest
import toolbus_contracts
from toolbus_contracts import (
    CallStartRequest,
    Credentials,
    EffectivePolicy,
    PolicySpec,
    Subjects,
    ToolbusError,
    ToolsetCreateRequest,
    parse_body,
    parse_duration,
)
from toolbus_contracts.errors import InvalidRequest, NotFound, Timeout


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b"{", "body"),
        (b"", "body"),
        (b"[]", "body"),
        (b'{"runId": "r"}', "tool"),
        (b'{"runId": 5, "tool": "x"}', "runId"),
        (b'{"runId": "r", "tool": "x", "extra": 1}', "extra"),
        (b'{"run_id": "r", "tool": "x"}', "run_id"),
        (b'{"runId": "r", "tool": "x", "input": []}', "input"),
    ],
)
def test_bad_bodies_name_the_field(raw: bytes, field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_body(CallStartRequest, raw)
    assert info.value.details["field"] == field
    assert field in info.value.message or field == "body"


def test_a_body_that_is_not_utf8_says_so() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_body(CallStartRequest, b'{"runId": "r\xff", "tool": "x"}')
    assert info.value.details == {"field": "body"}
    assert info.value.message.startswith("The body is not valid JSON: invalid unicode")  # once, not twice
    assert "(a body is UTF-8 text)" in info.value.message


def test_nested_field_path_is_named() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_body(
            ToolsetCreateRequest,
            b'{"mcp": [{"name": "ok", "url": "http://x", "policies": {"t": {"timeout": "-1s"}}}]}',
        )
    assert info.value.details["field"] == "mcp[0].policies.t.timeout"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("60s", 60), ("5m", 300), ("1h30m", 5400), ("1h", 3600), ("1.5s", 1.5)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "text",
    [
        "0s",
        "0ms",
        "-1s",
        "5",
        "",
        "5 m",
        "1d",
        "m5",
        "8760h1ms",
        "99999999999h",
        "9" * 400 + "ms",
        "\u0663s",
        "\uff15m",
    ],
)
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match=r"duration|longer than") as refused:
        parse_duration(text)
    assert len(str(refused.value)) < 120  # quoted in part: a long one gives a short message


def test_the_longest_duration_is_a_year() -> None:
    assert parse_duration("8760h") == timedelta(days=365)


def test_a_duration_too_long_for_a_timer_is_invalid_request_naming_the_field() -> None:
    # timedelta overflowed on these (an OverflowError: `internal`), before the bound.
    for text in ("99999999999h", "99999999999999999s", "99999999999999999999ms"):
        body = {"host": [{"name": "ask", "inputSchema": {"type": "object"}, "policy": {"timeout": text}}]}
        with pytest.raises(InvalidRequest) as info:
            parse_body(ToolsetCreateRequest, orjson.dumps(body))
        assert info.value.details["field"] == "host[0].policy.timeout"


def test_errors_round_trip_through_the_wire() -> None:
    for exc in (InvalidRequest("bad", details={"field": "x"}), NotFound("gone"), Timeout("slow")):
        back = ToolbusError.from_wire(exc.to_wire())
        assert type(back) is type(exc)
        assert back.message == exc.message and back.details == exc.details
    assert Timeout("x").retryable and not NotFound("x").retryable
    assert type(ToolbusError.from_wire({"code": "somethingNew", "message": "m"})).__name__ == "Internal"


def test_credential_values_never_print() -> None:
    creds = parse_body(
        Credentials, b'{"servers": {"gh": {"headers": {"Authorization": "Bearer tok-123456"}}}}'
    )
    assert "tok-123456" not in repr(creds) and "tok-123456" not in str(creds)
    assert creds.servers["gh"].plain_headers() == {"Authorization": "Bearer tok-123456"}


@pytest.mark.parametrize(
    "headers",
    [
        "{}",
        '{"Bad Name": "v"}',
        '{"X-A": ""}',
        '{"X-A": "a\\r\\nInjected: 1"}',
        '{"Host": "evil"}',
        '{"X-A": " padded"}',
    ],
)
def test_headers_http_forbids_are_refused(headers: str) -> None:
    raw = f'{{"servers": {{"gh": {{"headers": {headers}}}}}}}'.encode()
    with pytest.raises(InvalidRequest) as info:
        parse_body(Credentials, raw)
    assert info.value.details["field"].startswith("servers.gh.headers")


@pytest.mark.parametrize(
    ("headers", "field"),
    [
        ({"X-A": "s3cret" * 1500}, "servers.gh.headers.X-A"),  # 9,000 characters
        ({f"X-{i}": "v" for i in range(65)}, "servers.gh.headers"),
        ({f"X-{i}": "s3cret" * 160 for i in range(13)}, "servers.gh.headers"),  # 12.5 kB together
        ({"X-A": "s3cret", "x-a": "s3cret"}, "servers.gh.headers.X-A"),  # names are case-insensitive
        ({"X-A": "s3cret\x85"}, "servers.gh.headers.X-A"),  # a C1 control (NEL)
        ({"X" * 300: "s3cret"}, "servers.gh.headers." + "X" * 200 + "…"),
    ],
)
def test_headers_no_server_would_take_are_refused_without_quoting_them(
    headers: dict[str, str], field: str
) -> None:
    """Accepted, they made every call to that server fail five times (HTTP 431, or the
    connection dropped)."""
    with pytest.raises(InvalidRequest) as info:
        parse_body(Credentials, json.dumps({"servers": {"gh": {"headers": headers}}}))
    assert info.value.details["field"] == field
    assert "s3cret" not in str(info.value)


def test_effective_policy_defaults_by_kind() -> None:
    assert EffectivePolicy.for_kind("mcp", None).wire() == {
        "onInterruption": "retry",
        "approval": False,
        "timeout": "5m",
        "heartbeatTimeout": "60s",
        "concurrency": None,
    }
    host = EffectivePolicy.for_kind("host", PolicySpec(concurrency=3))
    assert host.timeout is None and host.concurrency == 3


def test_subjects_follow_the_prefix() -> None:
    s = Subjects("acme")
    assert s.calls_invoke == "acme.calls.invoke"
    assert s.call_events("r1", "c1") == "acme.events.calls.r1.c1"
    assert s.host_call("crm.find_customer") == "acme.host.call.crm.find_customer"
    assert s.workflows_start("triage") == "acme.workflows.start.triage"


def test_public_names_are_pinned() -> None:
    """`__all__` is every public name but the package's submodules (which of those are attributes
    depends on what else was imported first)."""
    public = {
        n
        for n in dir(toolbus_contracts)
        if not n.startswith("_") and not isinstance(getattr(toolbus_contracts, n), types.ModuleType)
    }
    assert set(toolbus_contracts.__all__) == public


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"approvalId": "a", "approve": "yes"}', "approve"),
        (b'{"approvalId": "a", "approve": 1}', "approve"),
        (b'{"approvalId": 5, "approve": true}', "approvalId"),
    ],
)
def test_wrong_types_are_not_coerced(raw: bytes, field: str) -> None:
    from toolbus_contracts import ApprovalDecideRequest

    with pytest.raises(InvalidRequest) as info:
        parse_body(ApprovalDecideRequest, raw)
    assert info.value.details["field"] == field


def test_search_limit_must_be_an_integer() -> None:
    from toolbus_contracts import ToolsetSearchRequest

    with pytest.raises(InvalidRequest):
        parse_body(ToolsetSearchRequest, b'{"id": "ts_x", "query": "q", "limit": "5"}')
    with pytest.raises(InvalidRequest):
        parse_body(ToolsetSearchRequest, b'{"id": "ts_x", "query": "q", "limit": 2.5}')


def test_nan_and_infinity_are_not_json_but_may_be_written_in_strings() -> None:
    from toolbus_contracts import ToolsetCreateRequest, parse_body
    from toolbus_contracts.errors import InvalidRequest

    for token in (b"NaN", b"Infinity", b"-Infinity"):
        body = b'{"host": [{"name": "a", "inputSchema": {"type": "object", "default": %s}}]}' % token
        with pytest.raises(InvalidRequest) as caught:
            parse_body(ToolsetCreateRequest, body)
        assert caught.value.details == {"field": "body"}
    ok = parse_body(
        ToolsetCreateRequest, b'{"host": [{"name": "a", "description": "NaN, Infinity", "inputSchema": {}}]}'
    )
    assert ok.host[0].description == "NaN, Infinity"


def test_numbers_toolbus_cannot_carry_are_invalid_request_naming_their_field() -> None:
    from toolbus_contracts import CallStartRequest, parse_body
    from toolbus_contracts.base import unfit_number
    from toolbus_contracts.errors import InvalidRequest

    head = b'{"runId": "run_1", "tool": "a.b", "input": '
    for body, field in (
        (b'{"a": [1, {"c": 1e400}]}}', "input.a[1].c"),
        (b'{"a": -1E999}}', "input.a"),
        (b'{"a": 1}, "x": 0.1e999}', "x"),
    ):
        with pytest.raises(InvalidRequest) as caught:
            parse_body(CallStartRequest, head + body)
        assert caught.value.details == {"field": field}, body
    # Finite doubles, 64-bit integers, and such text in strings pass.
    ok = parse_body(
        CallStartRequest,
        head + b'{"a": 1e308, "b": 18446744073709551615, "c": -9223372036854775808, "s": "1e400"}}',
    )
    assert ok.input["b"] == 2**64 - 1
    # Integers beyond 64 bits parse (pydantic keeps them) and are refused where they would be
    # written: `unfit_number` finds them.
    big = parse_body(CallStartRequest, head + b'{"a": {"b": [123456789012345678901234567890]}}}')
    assert unfit_number(big.input, ("input",)) == "input.a.b[0]"
    assert unfit_number({"a": -(2**63), "b": 2**64 - 1, "c": True, "d": 1.5}) is None
    assert unfit_number([float("nan")]) == "[0]"


def test_unfit_number_walks_without_recursion_and_refuses_what_json_cannot_be() -> None:
    """A Python value that holds itself or nests past `VALUE_DEPTH_MAX` is `InvalidRequest`
    naming where (was a RecursionError); one shared many times over is checked once per object."""
    from toolbus_contracts.base import VALUE_DEPTH_MAX, unfit_number
    from toolbus_contracts.errors import InvalidRequest

    loop: list[Any] = [1]
    loop.append({"back": loop})
    with pytest.raises(InvalidRequest, match="holds itself") as caught:
        unfit_number({"a": loop}, ("input",))
    assert caught.value.details == {"field": "input.a[1].back"}

    def nested(levels: int) -> list[Any]:
        top: list[Any] = []
        inner = top
        for _ in range(levels - 1):
            inner.append([])
            inner = inner[0]
        return top

    assert unfit_number({"a": nested(VALUE_DEPTH_MAX - 1)}) is None  # the dict is a level too
    orjson.dumps(nested(VALUE_DEPTH_MAX))  # the bound is what orjson writes, and no more
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(nested(VALUE_DEPTH_MAX + 1))
    for levels in (VALUE_DEPTH_MAX, 100_000):
        with pytest.raises(InvalidRequest, match=f"deeper than {VALUE_DEPTH_MAX}") as caught:
            unfit_number({"a": nested(levels)}, ("input",))
        assert caught.value.details == {"field": "input.a"}
    # "Billion laughs": 2**80 paths through 81 lists, walked in microseconds, not forever.
    laughs: list[Any] = [1.5, "lol"]
    for _ in range(80):
        laughs = [laughs, laughs]
    assert unfit_number(laughs) is None
    laughs = [[float("inf")]]
    for _ in range(80):
        laughs = [laughs, laughs]
    assert unfit_number(laughs) == "[0]" * 81 + "[0]"
    # Order is kept: the first unfit number, as a recursive walk would name it.
    assert unfit_number({"a": [1, {"b": float("nan")}], "c": float("inf")}) == "a[1].b"


@pytest.mark.parametrize(
    ("model", "body", "field", "default"),
    [
        ("ApprovalsListRequest", {}, "limit", 1000),
        ("ToolsetSearchRequest", {"id": "ts_" + "0" * 64, "query": "q"}, "limit", 5),
        ("WorkflowPublishRequest", {"name": "w", "inputSchema": {}}, "description", ""),
        ("ToolsetCreateRequest", {}, "mcp", []),
        ("ToolsetCreateRequest", {}, "host", []),
        ("ToolsetCreateRequest", {}, "workflows", []),
        ("CallStartRequest", {"runId": "r", "tool": "t"}, "input", {}),
    ],
)
def test_an_optional_field_sent_as_null_is_taken_as_absent(
    model: str, body: dict[str, Any], field: str, default: Any
) -> None:
    from toolbus_contracts.approvals import ApprovalsListRequest

    cls = ApprovalsListRequest if model == "ApprovalsListRequest" else getattr(toolbus_contracts, model)
    wire = {**body, field: None}
    parsed = parse_body(cls, json.dumps(wire))
    assert getattr(parsed, field) == default  # each of these is one word


def test_a_huge_key_gets_a_small_error_naming_its_start() -> None:
    """A 900 kB unknown field's name was quoted whole, twice: a reply over `max_payload`, which
    became `outputTooLarge` instead of `invalidRequest`."""
    with pytest.raises(InvalidRequest) as info:
        parse_body(CallStartRequest, json.dumps({"runId": "r", "tool": "t", "y" * 900_000: 1}))
    assert info.value.details == {"field": "y" * 200 + "…"}
    assert len(str(info.value)) < 300


def test_subject_matches_as_nats_delivers_and_consumer_deliveries_are_told_apart() -> None:
    from toolbus_contracts import consumer_delivery, subject_matches

    assert subject_matches("p.host.call.>", "p.host.call.crm.find")
    assert subject_matches("p.host.result.*", "p.host.result.call_1")
    assert not subject_matches("p.host.result.*", "p.host.result.a.b")
    assert not subject_matches("p.host.call.>", "p.host.call")
    assert subject_matches("p.calls.invoke", "p.calls.invoke")
    assert not subject_matches("p.calls.invoke", "p.calls.invoke.x")
    assert not subject_matches("p.workflows.publish", "$O.p_outputs.C.abc")
    # A request: its own subject and an inbox to answer. A consumer's delivery: the stored
    # subject and an ack subject for reply, whatever subject its deliveries were aimed at.
    assert not consumer_delivery("p.workflows.publish", "p.workflows.publish", "_INBOX.harness.x.1")
    assert not consumer_delivery("p.host.call.>", "p.host.call.t", "p.host.result.call_1")
    assert consumer_delivery("p.workflows.publish", "$O.p_outputs.C.abc", "$JS.ACK.OBJ_p_outputs.c.1.2.2.0.0")
    assert consumer_delivery("p.workflows.publish", "p.workflows.publish", "$JS.ACK.S.c.1.1.1.0.0")
    assert consumer_delivery("p.host.call.>", "p.events.calls.r.c", None)
    # A direct get's answer, sent to the reply subject its request named: the stored headers.
    assert consumer_delivery("p.host.call.>", "p.host.call.t", "", {"Nats-Stream": "S", "Nats-Sequence": "2"})
    # nats-server 2.10+'s no-responders status names the subject nobody serves: not a stored message
    no_responders = {"Status": "503", "Nats-Subject": "p.host.call.t"}
    assert not consumer_delivery("p.host.result.>", "p.host.result.c.t", None, no_responders)
    assert not consumer_delivery("p.host.call.>", "p.host.call.t", "p.host.result.c", {"traceparent": "x"})
