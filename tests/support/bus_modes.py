"""The NATS and Redis side of an e2e mode (tests/system/e2e/conftest.py's `bus` fixture): `open`, the
session's NATS with no users and the session's Redis, or `secured`, deploy/nats/'s configuration
with one user per role and service and a Redis with one ACL user per service
(toolbus_devstack.redis_acl)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from toolbus_nats_connect import NatsAuth

from tests.support.infra import (
    ServiceProcess,
    aservice_process,
    drop_deployment_state,
    drop_redis_keys,
    unique_prefix,
)
from tests.system.security.conftest import SecuredNats

MODES = ["open", "secured"]
PREFIX_POOL = 16
"""Subject prefixes the secured server's authorization is rendered for (`Bus.prefix()` fails
clearly once they are used up)."""


@dataclass
class Bus:
    """The NATS side of one mode: who connects how, and the prefixes to use."""

    mode: str
    nats_url: str
    secured_nats: SecuredNats | None = None
    prefixes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """Asynchronous errors the server reported on the clients' connections (permission
    violations among them): a flow that needs a permission its role lacks shows up here."""
    redis_url: str | None = None
    """Secured: the URL of the Redis with the ACL users, as its admin (`default`); the services
    connect to it as their own users (`service()`). None: the session's Redis."""
    redis_passwords: dict[str, str] = field(default_factory=dict)
    """Secured: the password of each service's Redis ACL user, by service name."""
    attacks: list[str] = field(default_factory=list)
    """Subjects a test publishes to as an attacker would: their refusals are the expected ones."""

    def refusals(self, lines: list[str]) -> list[str]:
        """The permission refusals among `lines` that no test expected (`attacks`)."""
        return [
            line
            for line in lines
            if "violation" in line.lower() and not any(a.lower() in line.lower() for a in self.attacks)
        ]

    @property
    def secured(self) -> bool:
        return self.secured_nats is not None

    def prefix(self, stem: str) -> str:
        """A subject / Redis key prefix of its own (secured: one the server's users are allowed)."""
        if self.secured_nats is None:
            return unique_prefix(stem)
        if not self.prefixes:
            raise AssertionError(
                f"the secured server's {PREFIX_POOL} prefixes are used up: raise PREFIX_POOL"
            )
        return self.prefixes.pop(0)

    def role_env(self, role: str) -> dict[str, str]:
        """`TOOLBUS_NATS_*` of `role` (a client role or a service name)."""
        if self.secured_nats is None:
            return {"TOOLBUS_NATS_URL": self.nats_url}
        return self.secured_nats.env(role)

    def service(
        self, name: str, env: Mapping[str, str], **kwargs: Any
    ) -> AbstractAsyncContextManager[ServiceProcess]:
        """`aservice_process(name, env)`, connected as the service's own NATS user and, in
        secured mode, its own Redis ACL user."""
        redis_user: dict[str, str] = {}
        if name in self.redis_passwords:
            redis_user = {
                "TOOLBUS_REDIS_USERNAME": name,
                "TOOLBUS_REDIS_PASSWORD": self.redis_passwords[name],
            }
        return aservice_process(name, {**env, **self.role_env(name), **redis_user}, **kwargs)

    def connect_options(self, role: str) -> dict[str, Any]:
        """`nats.connect` keyword arguments of `role`; the server's asynchronous errors on that
        connection (permission violations among them) are kept in `errors`."""

        async def on_error(exc: Exception) -> None:
            self.errors.append(f"{role}: {exc}")

        options = NatsAuth.from_env(self.role_env(role)).connect_options()
        return {**options, "error_cb": on_error, "connect_timeout": 10}

    async def connect(self, role: str, **kwargs: Any) -> Any:
        """A nats-py client connected as `role`."""
        import nats

        return await nats.connect(**{**self.connect_options(role), **kwargs})

    async def drop_state(self, nc: Any, redis_url: str, prefix: str) -> None:
        """Remove what a module left under `prefix`: its Redis keys, and unsecured its streams
        too (secured, the server is the session's own and gone with it; no user there deletes
        streams)."""
        if self.secured:
            await drop_redis_keys(redis_url, prefix)
        else:
            await drop_deployment_state(nc, redis_url, prefix)

    def permission_errors(self) -> list[str]:
        return [e for e in self.errors if "permissions violation" in e.lower()]
