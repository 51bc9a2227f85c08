"""deploy/compose/: `docker compose config` accepts the file, NATS runs the secured configuration
with JetStream on a volume, Redis is append-only, every service has a health check and exactly
its own settings, and .env.example lists every setting of every service."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, TypedDict

import pytest
from cryptography.fernet import Fernet
from toolbus_devstack.redis_acl import acl_rules, redis_users

from tests.deploy.conftest import COMPOSE, ROOT, compose_env, run_compose
from tests.deploy.settings_catalogue import SERVICES, all_settings, service_settings

NATS_CONF = ROOT / "deploy" / "nats"
# The Redis ACL users of deploy/redis/ (toolbus_devstack.redis_acl): one password each, which
# compose hands the redis service (all of them) and each service (its own, as TOOLBUS_REDIS_PASSWORD).
REDIS_USERS = [user.name for user in redis_users("toolbus")]
REDIS_USER_PASSWORDS = {f"TOOLBUS_REDIS_PASSWORD_{name.upper()}" for name in REDIS_USERS}
# Variables the compose file itself reads, that no service does.
COMPOSE_ONLY = {"TOOLBUS_IMAGE_PREFIX", "TOOLBUS_IMAGE_TAG", *REDIS_USER_PASSWORDS}
# Settings a service reads that compose does not hand it, and why:
NOT_GIVEN = {
    # compose authenticates to NATS with user and password (deploy/nats/); no token, creds or nkey files.
    # ... and binds its own port (no listening socket handed down: TOOLBUS_HTTP_FD).
    "all": {"TOOLBUS_NATS_TOKEN", "TOOLBUS_NATS_CREDS_FILE", "TOOLBUS_NATS_NKEY_FILE", "TOOLBUS_HTTP_FD"},
    # The registry keeps nothing in Redis, decrypts nothing and sends no webhooks.
    "registry": {"TOOLBUS_SECRET_KEY", "TOOLBUS_WEBHOOK_URL", "TOOLBUS_WEBHOOK_SECRET"},
    "dispatcher": {"TOOLBUS_WEBHOOK_URL", "TOOLBUS_WEBHOOK_SECRET"},
    "approval": set(),
    "credentials": set(),
    # The gateway decrypts nothing, sends no webhooks and keeps only its tokens in Redis.
    "gateway": {"TOOLBUS_SECRET_KEY", "TOOLBUS_WEBHOOK_URL", "TOOLBUS_WEBHOOK_SECRET"},
}
REDIS_SETTINGS = re.compile(r"^TOOLBUS_REDIS_")


class NatsCredentials(TypedDict, total=False):
    """What `connect` is given to log in with: a user and password, or nothing (anonymous)."""

    user: str
    password: str


def env_example_names() -> set[str]:
    """Every variable .env.example lists, set or commented out (`NAME=...` or `#NAME=...`)."""
    text = (COMPOSE / ".env.example").read_text()
    return set(re.findall(r"^#?(TOOLBUS_[A-Z0-9_]+)=", text, flags=re.MULTILINE))


def nats_conf_variables() -> set[str]:
    """The environment variables deploy/nats/*.conf reads (`$TOOLBUS_...`): the users' passwords."""
    names: set[str] = set()
    for conf in NATS_CONF.glob("*.conf"):
        for line in conf.read_text().splitlines():
            if not line.lstrip().startswith("#"):
                names |= set(re.findall(r"\$(TOOLBUS_[A-Z0-9_]+)", line))
    return names


def test_env_example_lists_every_setting_of_every_service() -> None:
    missing = all_settings() - env_example_names()
    assert missing == set(), f"add these to deploy/compose/.env.example: {sorted(missing)}"


def test_env_example_lists_nothing_that_is_not_read() -> None:
    unknown = env_example_names() - all_settings() - nats_conf_variables() - COMPOSE_ONLY
    assert unknown == set(), f"no service, nats-server or compose reads {sorted(unknown)}"


def test_env_example_gives_nats_server_every_password_its_configuration_reads() -> None:
    variables = nats_conf_variables()
    assert variables, "deploy/nats/*.conf reads no $TOOLBUS_* variable"
    assert variables <= env_example_names()


def test_compose_config_accepts_the_file(compose_config: dict[str, Any]) -> None:
    assert compose_config["name"] == "toolbus"
    assert set(compose_config["services"]) == {"nats", "redis", *SERVICES}
    assert set(compose_config["volumes"]) == {"nats-data", "redis-data"}


def test_compose_refuses_to_start_without_the_secrets(tmp_path: Path) -> None:
    result = run_compose(["config", "--quiet"], COMPOSE / ".env.example", tmp_path)
    assert result.returncode != 0
    for variable in ("TOOLBUS_SECRET_KEY", "TOOLBUS_REDIS_PASSWORD", "TOOLBUS_NATS_PASSWORD_DISPATCHER"):
        assert f"required variable {variable} is missing a value" in result.stderr


def test_nats_runs_the_secured_configuration_with_jetstream_on_a_volume(
    compose_config: dict[str, Any],
) -> None:
    nats = compose_config["services"]["nats"]
    command = nats["command"]
    assert command[command.index("-c") + 1] == "/etc/nats/nats-server.conf"
    assert command[command.index("-sd") + 1] == "/data"
    mounts = {v["target"]: v for v in nats["volumes"]}
    assert mounts["/data"]["type"] == "volume" and mounts["/data"]["source"] == "nats-data"
    conf = mounts["/etc/nats"]
    assert (conf["type"], conf["read_only"]) == ("bind", True)
    assert Path(conf["source"]) == NATS_CONF
    server_conf = (NATS_CONF / "nats-server.conf").read_text()
    assert re.search(r"^jetstream", server_conf, flags=re.MULTILINE)
    assert "include ./toolbus-auth.conf" in server_conf
    # nats-server is given every password its authorization reads, and nothing else of toolbus's.
    assert set(nats["environment"]) == nats_conf_variables()
    assert "healthz?js-enabled-only=true" in " ".join(nats["healthcheck"]["test"])


def test_redis_is_append_only_with_a_password_and_a_volume(compose_config: dict[str, Any]) -> None:
    redis = compose_config["services"]["redis"]
    script = redis["command"][-1]
    for flag in (
        "--appendonly yes",
        "--appendfsync everysec",
        "--maxmemory-policy noeviction",
        "--dir /data",
    ):
        assert flag in script
    # One ACL user per service, its password from the environment; no single shared password.
    assert "requirepass" not in script
    assert "user default on >%s" in script and '"$$TOOLBUS_REDIS_PASSWORD"' in script
    for name in REDIS_USERS:
        assert f"user {name} on >%s %s" in script
        assert f'"$$TOOLBUS_REDIS_PASSWORD_{name.upper()}"' in script
    assert set(redis["environment"]) == {
        "TOOLBUS_REDIS_PASSWORD",
        "TOOLBUS_REDIS_PREFIX",
        *REDIS_USER_PASSWORDS,
    }
    assert {(v["target"], v["source"]) for v in redis["volumes"]} == {("/data", "redis-data")}
    assert "redis-cli ping" in " ".join(redis["healthcheck"]["test"])
    assert redis["user"] == "redis"


@pytest.mark.parametrize("server", ["nats", "redis"])
def test_servers_run_read_only_without_capabilities(compose_config: dict[str, Any], server: str) -> None:
    spec = compose_config["services"][server]
    assert spec["read_only"] is True
    assert spec["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in spec["security_opt"]
    assert [(p["host_ip"], p["published"]) for p in spec["ports"]] == [
        ("127.0.0.1", {"nats": "4222", "redis": "6379"}[server])
    ]


@pytest.mark.parametrize("service", SERVICES)
def test_service_is_hardened_and_waits_for_healthy_dependencies(
    compose_config: dict[str, Any], service: str
) -> None:
    spec = compose_config["services"][service]
    assert spec["build"]["args"] == {"SERVICE": service}
    assert spec["build"]["dockerfile"] == "deploy/image/Dockerfile"
    assert Path(spec["build"]["context"]) == ROOT
    assert spec["image"] == f"toolbus-{service}:dev"
    assert "/readyz" in " ".join(spec["healthcheck"]["test"])
    assert spec["read_only"] is True
    assert spec["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in spec["security_opt"]
    assert spec["user"] == "10001:10001"
    needs = {"nats"} if service == "registry" else {"nats", "redis"}
    assert {name: dep["condition"] for name, dep in spec["depends_on"].items()} == dict.fromkeys(
        needs, "service_healthy"
    )
    published = [(p["host_ip"], p["target"]) for p in spec["ports"]]
    mcp = [("127.0.0.1", 8787)] if service == "gateway" else []  # the gateway's MCP endpoint
    console = [("127.0.0.1", 8788)] if service == "approval" else []  # the approvals web console
    assert published == [("127.0.0.1", 8080), *mcp, *console]


@pytest.mark.parametrize("service", SERVICES)
def test_service_gets_every_setting_it_reads_and_only_its_own_nats_password(
    compose_config: dict[str, Any], compose_env_file: Path, service: str
) -> None:
    env = compose_config["services"][service]["environment"]
    expected: frozenset[str] | set[str] = service_settings(service) - NOT_GIVEN["all"] - NOT_GIVEN[service]
    if service == "registry":
        expected = {name for name in expected if not REDIS_SETTINGS.match(name)}
    assert set(env) == expected
    dotenv = dict(
        line.split("=", 1)
        for line in compose_env_file.read_text().splitlines()
        if re.match(r"^TOOLBUS_\w+=", line)
    )
    assert env["TOOLBUS_NATS_USER"] == service
    assert env["TOOLBUS_NATS_INBOX_PREFIX"] == f"_INBOX.{service}"
    assert env["TOOLBUS_NATS_PASSWORD"] == dotenv[f"TOOLBUS_NATS_PASSWORD_{service.upper()}"]
    others = {
        v
        for k, v in dotenv.items()
        if k.startswith("TOOLBUS_NATS_PASSWORD_") and not k.endswith(service.upper())
    }
    assert others.isdisjoint(env.values())
    assert (env["TOOLBUS_HTTP_HOST"], env["TOOLBUS_HTTP_PORT"]) == ("0.0.0.0", "8080")
    if service in REDIS_USERS:
        # Its own Redis ACL user and password; never the default user's or another service's.
        assert env["TOOLBUS_REDIS_USERNAME"] == service
        assert env["TOOLBUS_REDIS_PASSWORD"] == dotenv[f"TOOLBUS_REDIS_PASSWORD_{service.upper()}"]
        other_redis = {
            v
            for k, v in dotenv.items()
            if k.startswith("TOOLBUS_REDIS_PASSWORD") and k != f"TOOLBUS_REDIS_PASSWORD_{service.upper()}"
        }
        assert other_redis.isdisjoint(env.values())
    # What .env leaves commented out stays unset in the container: the service's default applies.
    assert env["TOOLBUS_LOG_LEVEL"] is None


def test_compose_env_fills_every_secret_with_a_fresh_value() -> None:
    example = (COMPOSE / ".env.example").read_text()
    first, second = compose_env.render(example), compose_env.render(example)
    values = dict(line.split("=", 1) for line in first.splitlines() if re.match(r"^TOOLBUS_\w+=", line))
    assert (
        set(values)
        == {"TOOLBUS_SECRET_KEY", "TOOLBUS_REDIS_PASSWORD"} | REDIS_USER_PASSWORDS | nats_conf_variables()
    )
    Fernet(values.pop("TOOLBUS_SECRET_KEY").encode())
    for value in values.values():
        # nats-server reads these as configuration values: a letter then hex stays a string.
        assert re.fullmatch(r"p[0-9a-f]{48}", value)
    assert first != second
    assert len(set(values.values())) == len(values)


@pytest.mark.integration
async def test_nats_service_of_compose_runs_on_a_real_nats_server(
    compose_config: dict[str, Any], tmp_path: Path
) -> None:
    """The compose file's NATS command and environment (the passwords `make compose-env` wrote),
    run with a real nats-server outside Docker (on free loopback ports): JetStream answers its
    health check, each service connects as its own user, anonymous and wrong passwords are refused."""
    import nats
    import nats.aio.client
    import nats.errors
    from toolbus_devstack import find_nats_server, free_port, http_status, spawn, stop_process

    spec = compose_config["services"]["nats"]
    mounts = {v["target"]: v["source"] for v in spec["volumes"] if v["type"] == "bind"}
    port, monitor = free_port(), free_port()
    argv = [str(a) for a in spec["command"]]
    argv[argv.index("-c") + 1] = argv[argv.index("-c") + 1].replace("/etc/nats", mounts["/etc/nats"])
    argv[argv.index("-sd") + 1] = str(tmp_path / "data")
    argv[argv.index("-m") + 1] = str(monitor)
    binary = find_nats_server()
    assert binary, "no nats-server"
    log = tmp_path / "nats.log"
    proc = spawn(
        [binary, *argv, "-a", "127.0.0.1", "-p", str(port)], log, env=dict(spec["environment"]), detach=False
    )
    health = spec["healthcheck"]["test"][-1].replace("127.0.0.1:8222", f"127.0.0.1:{monitor}")
    try:
        for _ in range(200):
            if http_status(health) == 200:
                break
            assert proc.poll() is None, log.read_text()
            await asyncio.sleep(0.05)
        assert http_status(health) == 200
        url = f"nats://127.0.0.1:{port}"
        for service in SERVICES:
            env = compose_config["services"][service]["environment"]
            nc = await nats.connect(
                url,
                user=env["TOOLBUS_NATS_USER"],
                password=env["TOOLBUS_NATS_PASSWORD"],
                inbox_prefix=env["TOOLBUS_NATS_INBOX_PREFIX"],
                allow_reconnect=False,
                connect_timeout=5,
            )
            await nc.flush()
            await nc.close()
        registry = compose_config["services"]["registry"]["environment"]
        refused: list[NatsCredentials] = [
            {},
            {"user": "registry", "password": "wrong"},
            {"user": "dispatcher", "password": registry["TOOLBUS_NATS_PASSWORD"]},
        ]
        for credentials in refused:
            client = nats.aio.client.Client()
            try:
                with pytest.raises(nats.errors.Error, match="Authorization Violation"):
                    await client.connect(url, allow_reconnect=False, connect_timeout=5, **credentials)
            finally:
                await client.close()
    finally:
        stop_process(proc)


@pytest.mark.integration
async def test_redis_service_of_compose_runs_on_a_real_redis_server(
    compose_config: dict[str, Any], tmp_path: Path
) -> None:
    """The compose file's Redis command (its shell script, the passwords from the environment),
    run with a real redis-server outside Docker on a free loopback port: a password is required,
    the server is append-only and never evicts, no password is on its command line, and each
    service's ACL user (with the password compose hands that service) has exactly the rules of
    toolbus_devstack.redis_acl (keys, read-only keys, commands): the approval user is refused a
    credentials key and FLUSHALL, no user may SCAN or SCRIPT FLUSH."""
    import redis.asyncio as aioredis
    import redis.exceptions
    from toolbus_devstack import find_redis_server, free_port, spawn, stop_process

    spec = compose_config["services"]["redis"]
    script = spec["command"][-1].replace("$$", "$").replace("/tmp/redis.conf", str(tmp_path / "redis.conf"))
    script = script.replace(
        "--dir /data", f"--dir {tmp_path} --bind 127.0.0.1 --port {(port := free_port())}"
    )
    binary = find_redis_server()
    assert binary, "no redis-server"
    script = script.replace("exec redis-server", f"exec {binary}")
    password = spec["environment"]["TOOLBUS_REDIS_PASSWORD"]
    server_env = {k: v for k, v in spec["environment"].items() if v is not None}
    proc = spawn(
        [*spec["command"][:-1], script],
        tmp_path / "redis.log",
        env={**server_env, "PATH": "/usr/bin:/bin"},
        detach=False,
    )
    client = aioredis.Redis(host="127.0.0.1", port=port, password=password)
    anonymous = aioredis.Redis(host="127.0.0.1", port=port)
    try:
        for _ in range(200):
            try:
                if await client.ping():
                    break
            except redis.exceptions.ConnectionError:
                assert proc.poll() is None
                await asyncio.sleep(0.05)
        assert await client.config_get("appendonly") == {"appendonly": "yes"}
        assert await client.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert await client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        with pytest.raises(redis.exceptions.AuthenticationError):
            await anonymous.ping()
        cmdline = await asyncio.to_thread(Path(f"/proc/{proc.pid}/cmdline").read_text)
        for value in server_env.values():
            assert value not in cmdline
        # Each service's user has exactly the rules of toolbus_devstack.redis_acl (its keys, its
        # read-only keys, its commands), as Redis reads them: compared with the same rules set
        # on a probe user of this server.
        for user in redis_users("toolbus"):
            rules = acl_rules(user).split()
            await client.execute_command("ACL", "SETUSER", f"probe-{user.name}", *rules)  # type: ignore[no-untyped-call]
        acl = {line.split()[1]: line.split() for line in await client.acl_list()}
        for user in redis_users("toolbus"):
            ours = [w for w in acl[user.name][3:] if not w.startswith(("#", ">"))]
            probe = [w for w in acl[f"probe-{user.name}"][3:] if not w.startswith(("#", ">"))]
            assert ours == probe, user.name
            assert {w[1:] for w in ours if w.startswith("~")} == set(user.key_patterns)
            assert {w[3:] for w in ours if w.startswith("%R~")} == set(user.read_patterns)
            assert "-@all" in ours and "+scan" not in ours and "+keys" not in ours
        users: dict[str, aioredis.Redis[bytes]] = {}
        for name in REDIS_USERS:
            env = compose_config["services"][name]["environment"]
            users[name] = aioredis.Redis(
                host="127.0.0.1",
                port=port,
                username=env["TOOLBUS_REDIS_USERNAME"],
                password=env["TOOLBUS_REDIS_PASSWORD"],
            )
        try:
            reach: dict[str, bool] = {}
            for name, user_client in users.items():
                try:
                    await user_client.get("toolbus:cred:toolset:ts_x")
                    reach[name] = True
                except redis.exceptions.NoPermissionError:
                    reach[name] = False
            assert reach == {"dispatcher": True, "credentials": True, "approval": False, "gateway": False}
            await users["approval"].zcard("toolbus:{approvals}:pending")  # its own keys
            await users["gateway"].hgetall("toolbus:gw:tokens")  # its own keys
            with pytest.raises(redis.exceptions.NoPermissionError):
                await users["approval"].flushall()
            for user_client in users.values():
                with pytest.raises(redis.exceptions.NoPermissionError):
                    await user_client.execute_command("SCAN", "0")  # type: ignore[no-untyped-call]
                with pytest.raises(redis.exceptions.NoPermissionError):
                    await user_client.execute_command("SCRIPT", "FLUSH")  # type: ignore[no-untyped-call]
            wrong = aioredis.Redis(host="127.0.0.1", port=port, username="approval", password=password)
            try:
                with pytest.raises(redis.exceptions.AuthenticationError):
                    await wrong.ping()
            finally:
                await wrong.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag
        finally:
            for user_client in users.values():
                await user_client.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag
    finally:
        await client.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag
        await anonymous.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag
        stop_process(proc)
