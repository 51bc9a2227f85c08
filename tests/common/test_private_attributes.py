"""Every private attribute toolbus uses of a dependency is still there in the pinned version
(libs/common/src/toolbus_common/private/README.md lists them): an upgrade that takes one away
fails here, by name, before anything relies on it at run time."""

from __future__ import annotations

import importlib
import inspect

import httpx
import pytest
from faststream.nats import NatsBroker
from nats.aio.client import Client as NatsClient
from redis.asyncio import Redis
from redis.asyncio.lock import Lock


def test_nats_client_keeps_the_pending_buffer_raw_pub_writes() -> None:
    nc = NatsClient()
    for name in ("_pending", "_pending_data_size", "_max_pending_size", "_flush_queue", "_max_payload"):
        assert hasattr(nc, name), name
    assert callable(nc._flush_pending)
    assert isinstance(nc._pending, list)


def test_faststream_broker_keeps_its_connection_attribute() -> None:
    broker = NatsBroker()
    assert hasattr(broker, "_connection")


def test_redis_lock_keeps_its_token_in_local() -> None:
    lock = Lock(Redis(), "toolbus-test-private-lock", timeout=1.0)
    assert lock.local.token is None  # no acquire yet


def test_httpx_transport_keeps_the_pools_network_backend() -> None:
    transport = httpx.AsyncHTTPTransport()
    assert hasattr(transport._pool, "_network_backend")
    for module, name in (
        ("httpcore._backends.auto", "AutoBackend"),
        ("httpcore._backends.base", "SOCKET_OPTION"),
    ):
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("mcp.shared._httpx_utils", "next_request_within_origin"),
        ("mcp.shared._otel", "inject_trace_context"),
        ("httpcore2._backends.auto", "AutoBackend"),
        ("httpcore2._backends.base", "AsyncNetworkBackend"),
        ("httpcore2._types", "SOCKET_OPTION"),
    ],
)
def test_mcp_client_private_imports_still_exist(module: str, name: str) -> None:
    assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


def test_mcp_client_session_keeps_the_stamp_fast_calls_use() -> None:
    from mcp.client.session import ClientSession

    assert "self._stamp" in inspect.getsource(ClientSession.__init__)
