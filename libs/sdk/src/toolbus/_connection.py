"""How the SDK reaches NATS: the URL, the subject prefix, and the connection's credentials and TLS
from the builder the services use (`toolbus_common.nats_auth.NatsAuth`), so a harness connects with
the same `TOOLBUS_NATS_*` settings a service reads."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toolbus_common.nats_auth import NatsAuth
from toolbus_contracts import DEFAULT_PREFIX

AUTH_FIELDS = frozenset(f.name for f in dataclasses.fields(NatsAuth)) - {"servers"}
"""What `Toolbus.connect` takes besides URL and prefix: `user`, `password`, `token`, `creds_file`,
`nkey_file`, `tls_ca_file`, `tls_cert_file`, `tls_key_file`, `tls_server_name`, `inbox_prefix`."""


@dataclass(frozen=True)
class ConnectOptions:
    """Where and how to connect: `auth` holds servers, credentials and TLS (its repr hides secrets)."""

    prefix: str = DEFAULT_PREFIX
    auth: NatsAuth = field(default_factory=NatsAuth)
    name: str = "toolbus-sdk"
    connect_timeout: float = 5.0

    @property
    def nats_url(self) -> str:
        return ",".join(self.auth.servers)

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        nats_url: str | None = None,
        prefix: str | None = None,
        name: str | None = None,
        connect_timeout: float | None = None,
        **auth: Any,
    ) -> ConnectOptions:
        """`TOOLBUS_NATS_*` and `TOOLBUS_SUBJECT_PREFIX` from `environ` (default `os.environ`), then
        every argument that is not None. `auth` takes the `NatsAuth` fields (`AUTH_FIELDS`)."""
        env = os.environ if environ is None else environ
        unknown = sorted(set(auth) - AUTH_FIELDS)
        if unknown:
            raise TypeError(
                f"unknown connect option '{unknown[0]}' (known: {', '.join(sorted(AUTH_FIELDS))})"
            )
        given: dict[str, Any] = {k: v for k, v in auth.items() if v is not None}
        if nats_url:
            given["servers"] = [u.strip() for u in nats_url.split(",") if u.strip()]
        options = cls(
            prefix=prefix or env.get("TOOLBUS_SUBJECT_PREFIX") or DEFAULT_PREFIX,
            auth=dataclasses.replace(NatsAuth.from_env(env), **given),
        )
        if name is not None:
            options = dataclasses.replace(options, name=name)
        if connect_timeout is not None:
            options = dataclasses.replace(options, connect_timeout=connect_timeout)
        return options

    def nats_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `nats.connect` these options stand for."""
        return {**self.auth.connect_options(), "name": self.name, "connect_timeout": self.connect_timeout}
