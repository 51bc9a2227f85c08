"""Session fixtures every test can use: real NATS (JetStream) and Redis, unique prefixes, clients.

Where the servers come from, first that works:
1. `TOOLBUS_NATS_URL` / `TOOLBUS_REDIS_URL`, when set and answering;
2. testcontainers, when a Docker engine answers a ping;
3. the default local servers (127.0.0.1:4222 with JetStream, 127.0.0.1:6379), when they answer;
4. `nats-server -js` and `redis-server` / `valkey-server` started here on free ports, in temporary
   directories, and stopped when the session ends.

Everything a session writes is under `prefix` (subjects, streams, buckets) and `redis_prefix` (keys),
and is deleted at the end of the session unless `TOOLBUS_TEST_KEEP_STATE=1`.

Helpers for tests: `from tests.support.infra import request, service_process, aservice_process`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

# Before numpy is imported: the tests run the registry (its embedding encoder, numpy matmuls on an
# executor thread) in this process and also fork service processes from it (with a preexec_fn).
# numpy's OpenBLAS (0.3.31) deadlocks a fork() made while another thread is inside a
# multi-threaded matmul: the suite hung twice in tests/sdk's stack fixture, the main thread in
# Popen._execute_child, a leftover Encoder._forward on a worker thread (py-spy). One BLAS thread
# has nothing to stop at fork: 1,995 forks in 20 s beside a busy matmul thread, against a hang
# within seconds with the default (`bench/fork_blas_deadlock.py`).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
assert "numpy" not in sys.modules, "numpy was imported before OPENBLAS_NUM_THREADS could be set"

import pytest
import pytest_asyncio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    # So `tests.support.infra` imports the same way under any pytest import mode.
    sys.path.insert(0, str(ROOT))

from tests.support.infra import (
    DEFAULT_NATS_URL,
    DEFAULT_REDIS_URL,
    DEV_EGRESS_ALLOW,
    docker_engine_answers,
    free_port,
    js_name,
    nats_answers,
    redis_answers,
    start_nats_server,
    start_redis_server,
    unique_prefix,
)

KEEP_STATE = os.environ.get("TOOLBUS_TEST_KEEP_STATE", "") not in ("", "0", "false")


def _nats_from_container(stack: ExitStack) -> str:
    from testcontainers.community.nats import NatsContainer

    container = NatsContainer(jetstream=True)
    container.start()
    stack.callback(container.stop)
    url: str = container.nats_uri()
    return url


def _redis_from_container(stack: ExitStack) -> str:
    from testcontainers.community.redis import RedisContainer

    container = RedisContainer()
    container.start()
    stack.callback(container.stop)
    return f"redis://{container.get_container_host_ip()}:{container.get_exposed_port(6379)}/0"


def _resolve(
    *,
    env_var: str,
    default_url: str,
    answers: Callable[[str], bool],
    from_container: Callable[[ExitStack], str],
    start_local: Callable[[], str],
    stack: ExitStack,
) -> str:
    configured = os.environ.get(env_var)
    if configured and answers(configured):
        return configured
    if docker_engine_answers():
        return from_container(stack)
    if answers(default_url):
        return default_url
    return start_local()


@pytest.fixture(scope="session")
def _servers_stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


@pytest.fixture(scope="session")
def nats_url(_servers_stack: ExitStack, tmp_path_factory: pytest.TempPathFactory) -> str:
    """URL of a NATS server with JetStream that this session may use."""

    def start_local() -> str:
        base = tmp_path_factory.mktemp("nats")
        server = start_nats_server(free_port(), base / "store", base / "nats.log")
        _servers_stack.callback(server.stop)
        return server.url

    return _resolve(
        env_var="TOOLBUS_NATS_URL",
        default_url=DEFAULT_NATS_URL,
        answers=nats_answers,
        from_container=_nats_from_container,
        start_local=start_local,
        stack=_servers_stack,
    )


@pytest.fixture(scope="session")
def redis_url(_servers_stack: ExitStack, tmp_path_factory: pytest.TempPathFactory) -> str:
    """URL of a Redis-protocol server that this session may use."""

    def start_local() -> str:
        base = tmp_path_factory.mktemp("redis")
        server = start_redis_server(free_port(), base / "data", base / "redis.log")
        _servers_stack.callback(server.stop)
        return server.url

    return _resolve(
        env_var="TOOLBUS_REDIS_URL",
        default_url=DEFAULT_REDIS_URL,
        answers=redis_answers,
        from_container=_redis_from_container,
        start_local=start_local,
        stack=_servers_stack,
    )


@pytest.fixture(scope="session")
def prefix() -> str:
    """A subject prefix unique to this session (`tbt` + 8 hex digits): pass it as
    `TOOLBUS_SUBJECT_PREFIX`; streams and buckets are `js_name(prefix, ...)`."""
    return unique_prefix()


@pytest.fixture(scope="session")
def redis_prefix(prefix: str) -> str:
    """The Redis key prefix of this session (`TOOLBUS_REDIS_PREFIX`): the subject prefix, so a
    service's default (`key_prefix`) and the tests agree."""
    return prefix


@pytest.fixture(scope="session")
def secret_key() -> str:
    """The tests' Fernet key (`TOOLBUS_SECRET_KEY`): the one tests/support/commands.py signs
    the commands with that a test sends in a service's place."""
    from tests.support.commands import TEST_SECRET_KEY

    return TEST_SECRET_KEY


@pytest.fixture(scope="session")
def service_env(
    nats_url: str, redis_url: str, prefix: str, redis_prefix: str, secret_key: str
) -> dict[str, str]:
    """The `TOOLBUS_*` settings a service started by a test needs to join this session's stack
    (copy it and add `TOOLBUS_WEBHOOK_URL` etc. as a test needs)."""
    return {
        "TOOLBUS_NATS_URL": nats_url,
        "TOOLBUS_REDIS_URL": redis_url,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_REDIS_PREFIX": redis_prefix,
        "TOOLBUS_SECRET_KEY": secret_key,
        # the test MCP and HTTP servers listen on loopback, which a deployment's default refuses
        "TOOLBUS_EGRESS_ALLOW": DEV_EGRESS_ALLOW,
    }


async def _stream_names(nc: Any) -> list[str]:
    """Every stream name on the server, page by page (`$JS.API.STREAM.NAMES`)."""
    names: list[str] = []
    while True:
        msg = await nc.request("$JS.API.STREAM.NAMES", json.dumps({"offset": len(names)}).encode(), timeout=5)
        page = json.loads(msg.data)
        batch = page.get("streams") or []
        names.extend(batch)
        if not batch or len(names) >= int(page.get("total", 0)):
            return names


async def _delete_jetstream_state(nc: Any, prefix: str) -> None:
    """Delete the streams, KV buckets and object stores named under `prefix`."""
    own = js_name(prefix, "")
    js = nc.jetstream()
    for name in await _stream_names(nc):
        if name.removeprefix("KV_").removeprefix("OBJ_").startswith(own):
            await js.delete_stream(name)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def nc(nats_url: str, prefix: str) -> AsyncIterator[Any]:
    """A connected nats-py client for the session; the session's JetStream state is deleted at the
    end."""
    import nats

    client = await nats.connect(
        nats_url, name=f"toolbus-tests-{prefix}", connect_timeout=5, max_reconnect_attempts=3
    )
    try:
        yield client
    finally:
        if not KEEP_STATE and client.is_connected:
            await _delete_jetstream_state(client, prefix)
        await client.drain()


@pytest.fixture(scope="session")
def js(nc: Any) -> Any:
    """The JetStream context of `nc`."""
    return nc.jetstream()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def redis_client(redis_url: str, redis_prefix: str) -> AsyncIterator[Any]:
    """A `redis.asyncio.Redis` for the session (bytes replies); keys under `redis_prefix:` are
    deleted at the end."""
    from redis.asyncio import Redis

    # Typed as Any: the installed types-redis stubs predate `aclose`.
    client: Any = Redis.from_url(redis_url)
    try:
        yield client
    finally:
        if not KEEP_STATE:
            keys = [key async for key in client.scan_iter(match=f"{redis_prefix}:*", count=500)]
            for start in range(0, len(keys), 500):
                await client.unlink(*keys[start : start + 500])
        await client.aclose()
