"""The credentials service's OAuth requests and the deployment's egress policy, against real HTTP
servers on loopback with a stub in place of DNS: each connection goes to the address that was
checked, never to what the name resolves to later (no DNS-rebinding window); a name or an address
the policy refuses is refused before any connection, as `hostNotAllowed`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from toolbus_common.egress import EgressPolicy
from toolbus_credentials import oauth_protocol as proto
from toolbus_credentials.app import oauth_http
from toolbus_credentials.oauth_protocol import OAuthFailure
from toolbus_devstack.processes import free_port

from tests.support.http_servers import serve_in_thread

pytestmark = pytest.mark.integration

ALLOWED, FORBIDDEN = "127.0.0.2", "127.0.0.1"
"""Both loopback: the policy under test allows only the first."""


def _server(address: str, port: int, hits: list[str]) -> ThreadingHTTPServer:
    """Answers 404 to everything, on kept-alive HTTP/1.1 connections; records each request."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            return None

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            hits.append(f"{self.command} {self.path}")
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _answer

    return ThreadingHTTPServer((address, port), Handler)


@contextlib.contextmanager
def _pair() -> Iterator[tuple[int, list[str], list[str]]]:
    """A server at the allowed address and one at the forbidden one, on the same port."""
    port = free_port()
    good: list[str] = []
    evil: list[str] = []
    with serve_in_thread(_server(ALLOWED, port, good)), serve_in_thread(_server(FORBIDDEN, port, evil)):
        yield port, good, evil


async def test_a_connection_goes_to_the_address_checked_not_to_a_later_answer() -> None:
    answers: list[str] = []

    async def rebinding(host: str, port: int) -> list[str]:
        """Allowed at the first lookup (the check), forbidden at every later one."""
        answers.append(host)
        return [ALLOWED] if len(answers) == 1 else [FORBIDDEN]

    policy = EgressPolicy.parse(ALLOWED)
    with _pair() as (port, good, evil):
        async with oauth_http(policy, 5.0, rebinding) as http:
            with pytest.raises(OAuthFailure) as failed:
                await proto.discover(http, f"http://mcp.rebind.test:{port}/mcp")
        # Every request of the discovery reached the checked address on the one connection made.
        assert failed.value.error == "discoveryFailed"
        assert good == [
            "POST /mcp",
            "GET /.well-known/oauth-protected-resource/mcp",
            "GET /.well-known/oauth-protected-resource",
        ]
        assert evil == [] and answers == ["mcp.rebind.test"]
        # A new connection: the name now resolves to a forbidden address, so it is refused.
        async with oauth_http(policy, 5.0, rebinding) as http:
            with pytest.raises(OAuthFailure) as refused:
                await proto.discover(http, f"http://mcp.rebind.test:{port}/mcp")
        assert refused.value.error == "hostNotAllowed" and not refused.value.permanent
        assert "egress policy" in str(refused.value) and evil == []


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/mcp",
        "http://169.254.169.254/mcp",
        "http://[::ffff:127.0.0.1]:{port}/mcp",
        "http://inside.test:{port}/mcp",
    ],
)
async def test_the_default_policy_refuses_internal_addresses_before_connecting(url: str) -> None:
    async def internal(host: str, port: int) -> list[str]:
        return [FORBIDDEN]

    with _pair() as (port, good, evil):
        async with oauth_http(EgressPolicy(), 5.0, internal) as http:
            with pytest.raises(OAuthFailure) as refused:
                await proto.discover(http, url.format(port=port))
        assert refused.value.error == "hostNotAllowed"
        assert good == evil == []
