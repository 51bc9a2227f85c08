"""The e2e suite runs twice: `open` (the session's NATS, no users) and `secured` (a nats-server of
our own on a free port, with deploy/nats/'s configuration rendered by the generator `make up
TOOLBUS_SECURE=1` uses, fresh passwords, and TLS with client certificates required).

In `secured` mode each service connects as its own user (`bus.service(name, env)`), the test's
clients as their roles (`await bus.connect("harness" | "approver" | "worker" | ...)`): a harness
registers, opens runs, calls and reads events; approvals are listed and decided as `approver`;
host tools are served as `worker`; whatever else a test looks at (the INTERNAL stream, the
toolsets store) is read with the connection of the service that owns it. So every e2e flow also
shows that the roles of deploy/nats/ suffice for it. In `open` mode every role is a plain
connection to the session's NATS.

The secured server is started once per session. Its authorization is rendered for a pool of
subject prefixes made at start (`bus.prefix()` hands them out, one per module or harness), so the
modules keep prefixes of their own there too. In `secured` mode Redis is one of the session's
own too, with the ACL file `make up TOOLBUS_SECURE=1` loads (toolbus_devstack.redis_acl, rendered
for the same prefixes): each service connects as its Redis user, the tests as the admin
(`redis_url`). A command or key a service needs and its user lacks fails the suite at the end
(Redis's ACL LOG), as a NATS refusal does. In `open` mode it is the session's Redis.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from toolbus_devstack.redis_acl import redis_users, render_acl

from tests.support.bus_modes import MODES, PREFIX_POOL, Bus
from tests.support.infra import free_port, start_redis_server, unique_prefix
from tests.system.security.conftest import start_secured_nats


@pytest.fixture(scope="session", params=MODES)
def bus(
    request: pytest.FixtureRequest, nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bus]:
    if request.param == "open":
        yield Bus("open", nats_url)
        return
    prefixes = [unique_prefix("tbse") for _ in range(PREFIX_POOL)]
    tmp: Path = tmp_path_factory.mktemp("e2e-secured-nats")
    secured = start_secured_nats(tmp, prefixes=prefixes, tls=True)
    try:
        redis_passwords = {u.name: secrets.token_urlsafe(18) for u in redis_users()}
        admin = secrets.token_urlsafe(18)
        acl = tmp / "users.acl"
        acl.write_text(render_acl(prefixes, redis_passwords, admin_password=admin))
        redis = start_redis_server(
            free_port(), tmp / "redis", tmp / "redis.log", password=admin, args=["--aclfile", str(acl)]
        )
    except BaseException:
        secured.server.stop()
        raise
    refused_redis: list[dict[str, object]] = []
    try:
        bus_ = Bus(
            "secured", secured.url, secured, prefixes, redis_url=redis.url, redis_passwords=redis_passwords
        )
        yield bus_
        refused_redis = _acl_log(redis.url)
    finally:
        secured.server.stop()
        redis.stop()
    # Every command or key a service's Redis user was refused: a real flow needing what
    # toolbus_devstack.redis_acl does not give fails the suite here even when a service only logged it.
    assert refused_redis == [], f"the secured Redis refused ({acl}):\n" + "\n".join(
        map(str, refused_redis[:20])
    )
    # Every refusal the server logged, the services' included: a real flow needing a permission
    # that deploy/nats/ lacks fails the suite here even when a service only logged it.
    log = secured.server.log_path.read_text(errors="replace")
    refused = [
        line.split(" - ", 2)[-1] for line in bus_.refusals(log.splitlines()) if " Violation - " in line
    ]
    assert refused == [], f"the secured nats-server refused ({secured.server.log_path}):\n" + "\n".join(
        refused[:20]
    )


def _acl_log(url: str) -> list[dict[str, object]]:
    import redis

    client = redis.Redis.from_url(url)
    try:
        entries: list[dict[str, object]] = client.acl_log()
    finally:
        client.close()
    return entries


@pytest.fixture(scope="session")
def redis_url(bus: Bus, redis_url: str) -> str:
    """This mode's Redis: the secured one (as its admin) or the session's."""
    return bus.redis_url or redis_url


@pytest.fixture(scope="session")
def service_env(bus: Bus, redis_url: str, prefix: str, redis_prefix: str, secret_key: str) -> dict[str, str]:
    """The session's `service_env` on this mode's NATS (`bus.service()` adds the service's user)."""
    return {
        "TOOLBUS_NATS_URL": bus.nats_url,
        "TOOLBUS_REDIS_URL": redis_url,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_REDIS_PREFIX": redis_prefix,
        "TOOLBUS_SECRET_KEY": secret_key,
    }


@pytest.fixture(autouse=True)
def _no_permission_refused(bus: Bus) -> Iterator[None]:
    """No client of the test was refused a publish or subscribe (a role missing a permission)."""
    before = len(bus.errors)
    yield
    refused = bus.refusals(bus.errors[before:])
    assert refused == [], refused
