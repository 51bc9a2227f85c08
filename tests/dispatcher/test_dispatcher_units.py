"""Pure logic of the dispatcher: allow-list matching, schema checks naming the path, the
interruption policy, body encoding."""

from __future__ import annotations

import asyncio

import pytest
from toolbus_common.in_flight import InFlight
from toolbus_contracts.errors import HostNotAllowed, InvalidInput, UpstreamError, UpstreamUnreachable
from toolbus_dispatcher.allowlist import AllowList, normalize_host
from toolbus_dispatcher.executors.base import Interrupted
from toolbus_dispatcher.executors.http import encode_body
from toolbus_dispatcher.outcomes import after_interruption, backoff
from toolbus_dispatcher.outputs import ENVELOPE_ROOM, MIN_INLINE, inline_limit
from toolbus_dispatcher.validation import SchemaCache

ALLOW = AllowList(["api.github.com", "*.example.com", "127.0.0.1", "Bücher.example", "[::1]"])


@pytest.mark.parametrize(
    "url",
    [
        "https://api.github.com/repos",
        "https://API.GitHub.com./repos",
        "http://a.example.com/",
        "http://deep.a.example.com:8080/x",
        "http://127.0.0.1:9000/",
        "http://xn--bcher-kva.example/",
        "http://bücher.example/",
        "http://[::1]:80/",
    ],
)
def test_allowed_urls_pass(url: str) -> None:
    ALLOW.check(url)


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("https://evil.com/", "evil.com"),
        ("https://example.com/", "example.com"),
        ("http://api.github.com@evil.host/", "evil.host"),
        ("http://user:pw@api.github.com/", "api.github.com"),
        ("ftp://api.github.com/", "api.github.com"),
        ("file:///etc/passwd", ""),
        ("http://127.0.0.2/", "127.0.0.2"),
        ("http://notexample.com/", "notexample.com"),
        ("http://api.github.com.evil.com/", "api.github.com.evil.com"),
        ("http://[::2]/", "::2"),
    ],
)
def test_refused_urls_name_the_host(url: str, named: str) -> None:
    with pytest.raises(HostNotAllowed) as err:
        ALLOW.check(url)
    assert named in err.value.message


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9000/ok#frag\x00",
        "http://127.0.0.1:9000/\x01\x03",
        "http://api.github.com/a\x7fb",
        "http://127.0.0.1/" + "p" * 70_000,
        "http://[::1",
    ],
)
def test_urls_the_client_would_not_send_are_refused_not_raised(url: str) -> None:
    # found by tests/system/test_fuzz_calls.py: httpx.InvalidURL at send time ended the call `internal`
    with pytest.raises(HostNotAllowed, match="not a valid URL"):
        ALLOW.check(url)


PORTED = AllowList(
    ["api.example.com:8443", "*.corp.example:443", "127.0.0.1:9000", "[::1]:8080", "open.example"]
)


@pytest.mark.parametrize(
    "url",
    [
        "https://api.example.com:8443/x",
        "https://git.corp.example/",  # https without a port is 443
        "https://git.corp.example:443/",
        "http://127.0.0.1:9000/",
        "http://[::1]:8080/",
        "http://open.example:1234/",  # an entry without a port allows any
    ],
)
def test_an_entry_with_a_port_allows_that_port(url: str) -> None:
    PORTED.check(url)


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("https://api.example.com/x", "for other ports, not 443, https's default"),
        ("http://git.corp.example/", "for other ports, not 80, http's default"),
        ("https://git.corp.example:8443/", "for other ports, not 8443\\.$"),
        ("http://127.0.0.1:6379/", "Host '127.0.0.1' is on this toolset's http allow-list for other ports"),
        ("http://[::1]/", "Host '::1' is on"),
        ("http://[::1:8080]/", "Host '::1:8080' is not on"),  # a bare IPv6 entry has no port
        ("http://h.example:0/", "Host 'h.example' is not on"),
    ],
)
def test_an_entry_with_a_port_refuses_every_other_port(url: str, named: str) -> None:
    with pytest.raises(HostNotAllowed, match=named) as err:
        PORTED.check(url)
    assert err.value.details["host"] in url


def test_a_host_listed_with_and_without_a_port_is_allowed_on_every_port() -> None:
    both = AllowList(["h.example:8080", "h.example", "::1:8080"])
    both.check("http://h.example:9999/")
    both.check("http://[::1:8080]:1234/")  # `::1:8080` is an IPv6 address, on any port
    with pytest.raises(HostNotAllowed):
        both.check("http://[::1]:8080/")
    assert PORTED.ports("h.corp.example") == frozenset({443})


def test_ip_literals_never_match_wildcards() -> None:
    assert AllowList(["*.0.0.1"]).ports("127.0.0.1") == frozenset()


def test_host_normalisation() -> None:
    assert normalize_host("Example.COM.") == "example.com"
    assert normalize_host("bücher.example") == "xn--bcher-kva.example"
    assert normalize_host("[::1]") == "::1"


SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "filters": {"type": "array", "items": {"type": "integer"}}},
    "required": ["query"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({}, "$.query"),
        ({"query": 1}, "$.query"),
        ({"query": "x", "filters": [1, "two"]}, "$.filters[1]"),
    ],
)
def test_invalid_input_names_the_failing_path(value: dict[str, object], path: str) -> None:
    cache = SchemaCache()
    with pytest.raises(InvalidInput) as err:
        cache.check("ts_1", "t", SCHEMA, value)
    assert err.value.details["path"] == path
    assert path in err.value.message


def test_validators_are_compiled_once_per_pinned_schema() -> None:
    cache = SchemaCache()
    first = cache.validator("ts_1", "t", SCHEMA)
    assert first is cache.validator("ts_1", "t", SCHEMA)
    cache.check("ts_1", "t", SCHEMA, {"query": "ok"})


def test_schema_dialect_follows_dollar_schema() -> None:
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "items": [{"type": "string"}],
    }
    validator = SchemaCache().validator("ts", "d7", draft7)
    # Draft 7's validator (with the RE2 pattern keywords in place of `re`'s): its meta-schema
    assert validator is not None and validator.META_SCHEMA["$schema"] == draft7["$schema"]


def test_an_invalid_pinned_schema_is_not_enforced() -> None:
    SchemaCache().check("ts", "bad", {"type": "nonsense"}, {"anything": 1})


def test_interruption_policy() -> None:
    sent = Interrupted(UpstreamError("503"))
    never = Interrupted(UpstreamUnreachable("refused"), sent=False)
    assert after_interruption(sent, attempt=1, on_interruption="retry") is None
    last = after_interruption(sent, attempt=5, on_interruption="retry")
    assert last == {"status": "error", "error": {"code": "upstreamError", "message": "503"}}
    unknown = after_interruption(sent, attempt=1, on_interruption="at_most_once")
    assert unknown is not None and unknown["error"]["code"] == "outcomeUnknown"
    assert after_interruption(never, attempt=1, on_interruption="at_most_once") is None
    final = after_interruption(never, attempt=5, on_interruption="at_most_once")
    assert final is not None and final["error"]["code"] == "upstreamUnreachable"


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff(n, 0.5, 3.0) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


@pytest.mark.parametrize(
    ("data", "ctype", "expected"),
    [
        (b"hi", "text/plain", ("hi", "text")),
        ("é".encode("latin-1"), "text/plain; charset=ISO-8859-1", ("é", "text")),
        (b'{"a":1}', "application/problem+json", ('{"a":1}', "text")),
        (b"\x00\x01", "application/octet-stream", ("AAE=", "base64")),
        (b"\xff\xfe", "text/plain; charset=utf-8", ("//4=", "base64")),
        (b"abc", "", ("YWJj", "base64")),
        (b"", "application/octet-stream", ("", "text")),  # a 204 or a HEAD: the same as text
        (b"", "", ("", "text")),
    ],
)
def test_body_encoding(data: bytes, ctype: str, expected: tuple[str, str]) -> None:
    assert encode_body(data, ctype) == expected


def test_the_inline_output_limit_is_clamped_to_what_fits_in_one_nats_message() -> None:
    mib = 1024 * 1024
    assert inline_limit(None, mib) == (mib - ENVELOPE_ROOM, False)
    assert inline_limit(64 * mib, mib) == (mib - ENVELOPE_ROOM, True)
    assert inline_limit(mib - ENVELOPE_ROOM, mib) == (mib - ENVELOPE_ROOM, False)
    assert inline_limit(100_000, mib) == (100_000, False)
    assert inline_limit(None, 8 * mib) == (8 * mib - ENVELOPE_ROOM, False)
    assert inline_limit(None, 1000) == (MIN_INLINE, False)


# ---- the invokes in flight (the event relay waits for them; toolbus_common.in_flight) ------------


async def test_in_flight_idle_returns_when_the_last_one_leaves_or_the_wait_ends() -> None:
    loop = asyncio.get_running_loop()
    invokes = InFlight()
    await asyncio.wait_for(invokes.idle(60, loop), 1)  # none in flight: at once
    invokes.enter()
    invokes.enter()
    waiter = asyncio.create_task(invokes.idle(60, loop))
    await asyncio.sleep(0)
    invokes.leave()
    await asyncio.sleep(0)
    assert not waiter.done() and invokes.busy  # one is still in flight
    invokes.leave()
    await asyncio.wait_for(waiter, 1)
    assert not invokes.busy
    invokes.enter()  # one that never ends: the wait ends after `within`
    await asyncio.wait_for(invokes.idle(0.01, loop), 1)
    assert invokes.busy
    assert 0.005 <= invokes.since_entered() < 5  # on the clock `enter` read, after the 10 ms wait
    # no time left to wait (the relay's DEFER is over since the newest came in): not waited for
    waiter = asyncio.create_task(invokes.idle(0.0, loop))
    await asyncio.sleep(0)
    assert waiter.done()
