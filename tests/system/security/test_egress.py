"""The operator's egress policy (`TOOLBUS_EGRESS_ALLOW`) against real servers on loopback: under
the default policy an `http.allow` entry or an MCP URL naming an internal address is refused at
registration (`invalidRequest` naming the field, nothing sent), and at every connection the
dispatcher makes (a toolset pinned before the policy said so ends `hostNotAllowed`), with the
same error whether a port is open or closed; the IPv6 forms that carry an internal IPv4 address
are refused too; what the operator allows is accepted. A redirect to another origin carries only
the caller's headers that hold no credential."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import pytest_asyncio
from toolbus_common import Settings
from toolbus_common.egress import EgressPolicy
from toolbus_contracts import Subjects
from toolbus_contracts.errors import HostNotAllowed
from toolbus_devstack import DEV_EGRESS_ALLOW
from toolbus_dispatcher.executors.base import Attempt
from toolbus_dispatcher.executors.http import HttpExecutor
from toolbus_dispatcher.records import CallRecord
from toolbus_registry.app import RegistryApp

from tests.dispatcher.test_dispatcher_helpers import Harness
from tests.support.http_servers import serve_in_thread
from tests.support.infra import free_port, request
from tests.support.mcp_servers import McpTestServer, echo_tools

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

# Every spelling the issue found let through, and the special ranges the default refuses.
INTERNAL_ENTRIES = [
    "169.254.169.254",  # cloud metadata
    "10.0.0.1",
    "0.0.0.0",
    "localhost",
    "*.localhost",
    "127.0.0.1",
    "100.64.0.1",  # CGNAT
    "192.0.2.1",  # documentation
    "224.0.0.1",  # multicast
    "[::1]",
    "fd00:ec2::254",  # AWS metadata over IPv6
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:0:7f00:1",  # IPv4-translated ::ffff:0:127.0.0.1
    "::7f00:1",  # IPv4-compatible ::127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "64:ff9b:1::a00:1",  # local-use NAT64
    "2002:a00:1::",  # 6to4 of 10.0.0.1
    "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo
    "fe80::1",
    "ff02::1",
    "::",
]


class _Echo(BaseHTTPRequestHandler):
    """Answers `/to/<url>` with a 302 there; anything else with the request's headers as JSON."""

    seen: list[dict[str, str]] = []

    def log_message(self, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        if self.path.startswith("/to/"):
            self.send_response(302)
            self.send_header("Location", self.path.removeprefix("/to/"))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.seen.append(headers)
        body = json.dumps(headers).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def web() -> Iterator[int]:
    with serve_in_thread(ThreadingHTTPServer(("127.0.0.1", 0), _Echo)) as port:
        yield port


@pytest.fixture(scope="module")
def closed_port() -> int:
    return free_port()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def mcp() -> AsyncIterator[McpTestServer]:
    async with McpTestServer(name="inside") as server:
        yield server


def _settings(service_env: dict[str, str], prefix: str, egress: str) -> Settings:
    env: dict[str, Any] = {k.removeprefix("TOOLBUS_").lower(): v for k, v in service_env.items()}
    env.update(subject_prefix=prefix, egress_allow=egress)
    return Settings(**env)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def strict_registry(service_env: dict[str, str]) -> AsyncIterator[Subjects]:
    """A registry under the default policy (its own prefix): public addresses only."""
    settings = _settings(service_env, service_env["TOOLBUS_SUBJECT_PREFIX"] + ".strict", "")
    app = RegistryApp(settings)
    await app.start()
    yield settings.subjects
    await app.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def lenient_registry(service_env: dict[str, str]) -> AsyncIterator[Subjects]:
    """A registry whose operator allows loopback and 10.0.0.0/8."""
    settings = _settings(
        service_env, service_env["TOOLBUS_SUBJECT_PREFIX"] + ".lenient", DEV_EGRESS_ALLOW + ",10.0.0.0/8"
    )
    app = RegistryApp(settings)
    await app.start()
    yield settings.subjects
    await app.stop()


async def _create(nc: Any, subjects: Subjects, body: dict[str, Any]) -> dict[str, Any]:
    return await request(nc, subjects.toolsets_create, body, timeout=20)


def _refused(reply: dict[str, Any], field: str) -> dict[str, Any]:
    assert reply["ok"] is False, reply
    error: dict[str, Any] = reply["error"]
    assert error["code"] == "invalidRequest", error
    assert error["details"]["field"] == field, error
    assert "TOOLBUS_EGRESS_ALLOW" in error["message"], error
    return error


# ---- registration ------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", INTERNAL_ENTRIES)
async def test_an_allow_entry_naming_an_internal_address_is_refused_at_registration(
    nc: Any, strict_registry: Subjects, entry: str
) -> None:
    reply = await _create(nc, strict_registry, {"http": {"allow": ["api.example.com", entry]}})
    _refused(reply, "http.allow[1]")


async def test_allow_entries_the_operator_allows_are_accepted(nc: Any, lenient_registry: Subjects) -> None:
    reply = await _create(
        nc, lenient_registry, {"http": {"allow": ["127.0.0.1", "localhost:8080", "10.0.0.1", "::1"]}}
    )
    assert reply["ok"] is True, reply
    # the operator's allowance is the bound: what it does not name is still refused
    _refused(await _create(nc, lenient_registry, {"http": {"allow": ["169.254.169.254"]}}), "http.allow[0]")
    _refused(await _create(nc, lenient_registry, {"http": {"allow": ["192.168.1.1"]}}), "http.allow[0]")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "2130706433", "[::1]"])
async def test_an_mcp_url_naming_an_internal_address_is_refused_the_same_open_or_closed(
    nc: Any, strict_registry: Subjects, mcp: McpTestServer, closed_port: int, host: str
) -> None:
    """Nothing is sent to find out: an open port (a live MCP server) and a closed one give the
    very same error, and the live server gets no request."""
    requests_before = mcp.list_requests + mcp.initializations + len(mcp.calls)
    errors = []
    for port in (mcp.port, closed_port):
        body = {"mcp": [{"name": "inside", "url": f"http://{host}:{port}/mcp"}]}
        errors.append(_refused(await _create(nc, strict_registry, body), "mcp[0].url"))
    assert errors[0] == errors[1]
    assert errors[0]["details"] == {"field": "mcp[0].url", "server": "inside"}
    assert mcp.list_requests + mcp.initializations + len(mcp.calls) == requests_before


async def test_an_mcp_url_the_operator_allows_is_listed(
    nc: Any, lenient_registry: Subjects, mcp: McpTestServer
) -> None:
    reply = await _create(nc, lenient_registry, {"mcp": [{"name": "inside", "url": mcp.url}]})
    assert reply["ok"] is True, reply


# ---- every connection ------------------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def strict_dispatcher(nats_url: str, redis_url: str) -> AsyncIterator[Harness]:
    """A dispatcher under the default policy; toolsets are written straight into its store (as
    ones registered before the operator's policy said what it says now)."""
    harness = Harness(nats_url, redis_url)
    await harness.connect()
    await harness.dispatcher(egress_allow="")
    try:
        yield harness
    finally:
        await harness.close()


def _pinned_echo(url: str) -> dict[str, Any]:
    keep = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
    tools = [{k: v for k, v in t.items() if k in keep} for t in echo_tools()]
    return {"servers": [{"name": "inside", "url": url, "tools": tools}]}


async def test_a_pinned_mcp_server_on_an_internal_address_ends_host_not_allowed_open_or_closed(
    strict_dispatcher: Harness, mcp: McpTestServer, closed_port: int
) -> None:
    h = strict_dispatcher
    outcomes = []
    calls_before = len(mcp.calls)
    for port in (mcp.port, closed_port):
        run = await h.open_run(await h.toolset(_pinned_echo(f"http://127.0.0.1:{port}/mcp")))
        data = await h.invoke(run, "inside.echo", {"text": "hi"})
        assert data["outcome"]["status"] == "error", data
        outcomes.append(data["outcome"]["error"])
    assert outcomes[0]["code"] == "hostNotAllowed", outcomes
    assert outcomes[0] == outcomes[1]
    assert "egress policy" in outcomes[0]["message"] and "'inside'" in outcomes[0]["message"], outcomes
    assert len(mcp.calls) == calls_before


async def test_a_pinned_allow_list_naming_loopback_ends_host_not_allowed_open_or_closed(
    strict_dispatcher: Harness, web: int, closed_port: int
) -> None:
    h = strict_dispatcher
    run = await h.open_run(await h.toolset({"http": {"allow": ["127.0.0.1", "localhost"]}}))
    seen_before = len(_Echo.seen)
    outcomes = []
    for port in (web, closed_port):
        data = await h.invoke(run, "http.fetch", {"url": f"http://127.0.0.1:{port}/"})
        outcomes.append(data["outcome"]["error"])
    assert outcomes[0]["code"] == "hostNotAllowed" and outcomes[0] == outcomes[1]
    data = await h.invoke(run, "http.fetch", {"url": f"http://localhost:{web}/"})
    assert data["outcome"]["error"]["code"] == "hostNotAllowed"
    assert len(_Echo.seen) == seen_before


# ---- IPv6 forms ------------------------------------------------------------------------------------


def _attempt(url: str, allow: list[str], headers: dict[str, Any] | None = None) -> Attempt:
    call = CallRecord(
        "call_e", "run_e", "http.fetch", "{}", "key-e", "ts_" + "_".join(allow), None, "retry", 1, "running"
    )
    inp: dict[str, Any] = {"url": url}
    if headers is not None:
        inp["headers"] = headers
    return Attempt(call, None, 1, inp, 10.0, tuple(allow))  # type: ignore[arg-type]  # the http tool reads no Tool field


@pytest_asyncio.fixture(loop_scope="session")
async def strict_fetcher() -> AsyncIterator[HttpExecutor]:
    executor = HttpExecutor(max_body=1 << 20, max_redirects=5)
    try:
        yield executor
    finally:
        await executor.aclose()


@pytest.mark.parametrize(
    "literal",
    ["::ffff:7f00:1", "::ffff:0:7f00:1", "::7f00:1", "64:ff9b::7f00:1", "64:ff9b:1::7f00:1", "2002:7f00:1::"],
)
async def test_ipv6_forms_carrying_loopback_are_refused_when_listed(
    strict_fetcher: HttpExecutor, web: int, literal: str
) -> None:
    """The allow-list lists the literal itself: before, a listed literal was connected to as is."""
    with pytest.raises(HostNotAllowed) as err:
        await strict_fetcher.execute(_attempt(f"http://[{literal}]:{web}/", [literal]))
    assert err.value.details["host"] == ipaddress.ip_address(literal).compressed


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("::ffff:10.0.0.1", True),
        ("::ffff:0:10.0.0.1", True),
        ("::10.0.0.1", True),
        ("64:ff9b::10.0.0.1", True),
        ("2002:a00:1::", True),
        ("::ffff:169.254.169.254", False),
        ("64:ff9b::a9fe:a9fe", False),
        ("8.8.8.8", True),
        ("::ffff:8.8.8.8", True),
        ("2001:4860:4860::8888", True),
        ("169.254.169.254", False),
    ],
)
async def test_the_operator_allows_an_ipv4_network_in_every_form_that_carries_it(
    address: str, allowed: bool
) -> None:
    assert EgressPolicy.parse("10.0.0.0/8").allows_address(address) is allowed


# ---- redirects -------------------------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="session")
async def loopback_fetcher() -> AsyncIterator[HttpExecutor]:
    executor = HttpExecutor(max_body=1 << 20, max_redirects=5, egress=EgressPolicy.parse(DEV_EGRESS_ALLOW))
    try:
        yield executor
    finally:
        await executor.aclose()


CALLER_HEADERS = {
    "Accept": "application/json",
    "Accept-Language": "fr",
    "User-Agent": "agent/1",
    "Authorization": "Bearer SECRET-A",
    "X-Api-Key": "SECRET-K",
    "Cookie": "s=SECRET-C",
    "X-Vendor-Token": "SECRET-V",
}


async def test_a_redirect_to_another_origin_carries_no_credential_header(
    loopback_fetcher: HttpExecutor, web: int
) -> None:
    # 127.0.0.1 -> localhost: another host, the same server
    url = f"http://127.0.0.1:{web}/to/http://localhost:{web}/landed"
    out = await loopback_fetcher.execute(_attempt(url, ["127.0.0.1", "localhost"], CALLER_HEADERS))
    got = json.loads(out["body"])
    assert (
        got["accept"] == "application/json"
        and got["accept-language"] == "fr"
        and got["user-agent"] == "agent/1"
    )
    for name in ("authorization", "x-api-key", "cookie", "x-vendor-token"):
        assert name not in got, (name, got)
    assert "SECRET" not in out["body"]


async def test_a_redirect_within_the_origin_keeps_the_callers_headers(
    loopback_fetcher: HttpExecutor, web: int
) -> None:
    url = f"http://127.0.0.1:{web}/to/http://127.0.0.1:{web}/landed"
    out = await loopback_fetcher.execute(_attempt(url, ["127.0.0.1"], CALLER_HEADERS))
    got = json.loads(out["body"])
    assert got["x-api-key"] == "SECRET-K" and got["authorization"] == "Bearer SECRET-A"
