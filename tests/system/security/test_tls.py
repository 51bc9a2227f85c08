"""TLS on both buses, with a throwaway CA: a nats-server with deploy/nats/'s users that requires
client certificates (`--tlsverify`), and a Redis that speaks only TLS (`--port 0 --tls-port`) with
client certificates and a password. The registry and the dispatcher run as processes on both and
serve a call end to end (the dispatcher's hot-path pipe included); a client without the CA, without
a client certificate, or with a wrong Redis password is refused, and no password is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
import redis
from nats.aio.client import Client
from toolbus_common.connections import connect_redis, connect_script_pipe
from toolbus_common.script_pipe import PipeConnectionError
from toolbus_common.settings import Settings
from toolbus_devstack.tls import DevPki, make_dev_pki
from toolbus_nats_connect import NatsAuth

from tests.support.infra import aservice_process, find_redis_server, free_port, request, spawn, stop_process
from tests.support.mcp_servers import McpTestServer
from tests.system.security.conftest import SecuredNats, start_secured_nats

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return make_dev_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_nats(pki: DevPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredNats]:
    args: tuple[str, ...] = ("--tls", "--tlscert", str(pki.server_cert), "--tlskey", str(pki.server_key))
    args += ("--tlscacert", str(pki.ca), "--tlsverify")
    secured = start_secured_nats(tmp_path_factory.mktemp("tls-nats"), args=args)
    try:
        yield secured
    finally:
        secured.server.stop()


@pytest.fixture(scope="module")
def tls_redis(pki: DevPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    binary = find_redis_server()
    assert binary is not None
    port, password = free_port(), "p" + secrets.token_hex(16)
    tmp = tmp_path_factory.mktemp("tls-redis")
    conf = tmp / "redis.conf"  # the password in a file, not on the command line
    conf.write_text(
        f"bind 127.0.0.1\nport 0\ntls-port {port}\ntls-cert-file {pki.server_cert}\n"
        f"tls-key-file {pki.server_key}\ntls-ca-cert-file {pki.ca}\ntls-auth-clients yes\n"
        f'requirepass {password}\ndir {tmp}\nsave ""\nappendonly no\n'
    )
    conf.chmod(0o600)
    proc = spawn([binary, str(conf)], tmp / "redis.log", env=None, detach=False)
    try:
        client = redis.Redis(
            port=port,
            password=password,
            ssl=True,
            ssl_ca_certs=str(pki.ca),
            ssl_certfile=str(pki.client_cert),
            ssl_keyfile=str(pki.client_key),
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                if client.ping():
                    break
            except redis.RedisError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        client.close()
        yield port, password
    finally:
        stop_process(proc)


def _tls_env(secured: SecuredNats, role: str, pki: DevPki) -> dict[str, str]:
    return {
        **secured.env(role),
        "TOOLBUS_NATS_TLS_CA_FILE": str(pki.ca),
        "TOOLBUS_NATS_TLS_CERT_FILE": str(pki.client_cert),
        "TOOLBUS_NATS_TLS_KEY_FILE": str(pki.client_key),
    }


async def test_nats_requires_the_ca_and_a_client_certificate(tls_nats: SecuredNats, pki: DevPki) -> None:
    good = NatsAuth.from_env(_tls_env(tls_nats, "harness", pki))
    nc = await nats.connect(**good.connect_options(), allow_reconnect=False, connect_timeout=5)
    assert nc.is_connected
    await nc.close()
    no_client_cert = NatsAuth.from_env({**tls_nats.env("harness"), "TOOLBUS_NATS_TLS_CA_FILE": str(pki.ca)})
    no_ca = NatsAuth.from_env(
        {**tls_nats.env("harness"), "TOOLBUS_NATS_URL": tls_nats.url.replace("nats://", "tls://")}
    )
    for auth in (no_client_cert, no_ca):
        client = Client()
        try:
            with pytest.raises(Exception):  # noqa: B017, PT011 - TLS alert or certificate error, by version
                await client.connect(**auth.connect_options(), allow_reconnect=False, connect_timeout=3)
        finally:
            # nats-py's close() after a failed TLS handshake can wait forever: bounded here.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 2)


async def test_redis_tls_with_a_password_on_redis_py_and_the_pipe(
    tls_redis: tuple[int, str], pki: DevPki
) -> None:
    port, password = tls_redis
    settings = Settings(
        redis_url=f"rediss://127.0.0.1:{port}/0",
        redis_password=password,
        redis_tls_ca_file=str(pki.ca),
        redis_tls_cert_file=str(pki.client_cert),
        redis_tls_key_file=str(pki.client_key),
    )
    client = connect_redis(settings)
    pipe = connect_script_pipe(settings, client)
    try:
        assert await client.ping()
        sha = await client.script_load("return ARGV[1]")  # type: ignore[no-untyped-call]  # types-redis 4.6 leaves it unannotated
        assert await pipe.evalsha(sha, [], ["over tls"]) == b"over tls"
    finally:
        await pipe.aclose()
        await client.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag
    wrong = Settings(**{**settings.model_dump(), "redis_password": "wrong"})
    bad_pipe = connect_script_pipe(wrong)
    with pytest.raises(PipeConnectionError) as refused:
        await bad_pipe.evalsha(sha, [], ["x"])
    assert password not in str(refused.value) and "wrong" not in str(refused.value)
    await bad_pipe.aclose()


async def test_services_serve_a_call_over_tls_on_both_buses(
    tls_nats: SecuredNats, tls_redis: tuple[int, str], pki: DevPki, secret_key: str, tmp_path: Path
) -> None:
    port, password = tls_redis
    redis_env = {
        "TOOLBUS_REDIS_URL": f"rediss://127.0.0.1:{port}/0",
        "TOOLBUS_REDIS_PASSWORD": password,
        "TOOLBUS_REDIS_TLS_CA_FILE": str(pki.ca),
        "TOOLBUS_REDIS_TLS_CERT_FILE": str(pki.client_cert),
        "TOOLBUS_REDIS_TLS_KEY_FILE": str(pki.client_key),
        "TOOLBUS_SECRET_KEY": secret_key,
        "TOOLBUS_LOG_LEVEL": "WARNING",
    }
    harness_auth = NatsAuth.from_env(_tls_env(tls_nats, "harness", pki))
    async with (
        McpTestServer(name="s") as mcp,
        aservice_process("registry", {**_tls_env(tls_nats, "registry", pki), **redis_env}, log_dir=tmp_path),
        aservice_process(
            "credentials", {**_tls_env(tls_nats, "credentials", pki), **redis_env}, log_dir=tmp_path
        ),
        aservice_process(
            "dispatcher", {**_tls_env(tls_nats, "dispatcher", pki), **redis_env}, log_dir=tmp_path
        ),
    ):
        nc = await nats.connect(**harness_auth.connect_options(), connect_timeout=5)
        try:
            created = await request(
                nc, "toolbus.toolsets.create", {"mcp": [{"name": "s", "url": mcp.url}]}, timeout=60
            )
            assert created["ok"], created
            run = await request(nc, "toolbus.runs.open", {"toolsetId": created["data"]["id"]}, timeout=30)
            body = {"runId": run["data"]["runId"], "tool": "s.echo", "input": {"text": "tls"}}
            done = await request(nc, "toolbus.calls.invoke", body, timeout=30)
            assert done["ok"] and done["data"]["outcome"] == {"status": "ok", "output": {"text": "tls"}}, done
        finally:
            await nc.close()
    logs = "".join(p.read_text() for p in tmp_path.glob("*.log"))  # noqa: ASYNC240
    assert password not in logs
    assert not [secret for secret in tls_nats.passwords.values() if secret in logs]
