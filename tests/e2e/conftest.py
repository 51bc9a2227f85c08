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
modules keep prefixes of their own there too. Redis is the session's Redis in both modes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.conftest import start_secured_nats
from tests.support.bus_modes import MODES, PREFIX_POOL, Bus
from tests.support.infra import unique_prefix


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
    bus_ = Bus("secured", secured.url, secured, prefixes)
    try:
        yield bus_
    finally:
        secured.server.stop()
    # Every refusal the server logged, the services' included: a real flow needing a permission
    # that deploy/nats/ lacks fails the suite here even when a service only logged it.
    log = secured.server.log_path.read_text(errors="replace")
    refused = [
        line.split(" - ", 2)[-1] for line in bus_.refusals(log.splitlines()) if " Violation - " in line
    ]
    assert refused == [], f"the secured nats-server refused ({secured.server.log_path}):\n" + "\n".join(
        refused[:20]
    )


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
