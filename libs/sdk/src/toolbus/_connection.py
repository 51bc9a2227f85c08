"""How the SDK reaches NATS: the URL, the subject prefix, and the connection's credentials and TLS,
from the services' own `TOOLBUS_NATS_*` settings and builder, `toolbus_nats_connect.NatsAuth` (a
package with nats-py its only dependency; not `toolbus_common`, which brings the services' runtime:
~1 s of import time for every CLI command, measured in design.md)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from toolbus_contracts import DEFAULT_PREFIX, check_prefix
from toolbus_nats_connect import NatsAuth
from toolbus_nats_connect import flush as flush  # the SDK's modules take it from here


@dataclass(frozen=True)
class ConnectOptions(NatsAuth):
    """Where and how to connect; the repr never shows a password or token.

    The servers, credentials, TLS and inbox are `NatsAuth`'s (the services' builder), so the SDK
    sends nats-py exactly what a service with the same settings would. Authentication, at most
    one sent, in this order of precedence: `creds_file` (JWT + nkey seed), `nkey_file`, `user` +
    `password`, `token`. TLS is on for a `tls://` URL or any TLS file; `tls_cert_file`
    (+ `tls_key_file`) is the client certificate.
    """

    prefix: str = DEFAULT_PREFIX
    name: str = "toolbus-sdk"
    connect_timeout: float = 5.0

    def __post_init__(self) -> None:
        check_prefix(self.prefix)  # ValueError: no subject could be built under it

    @property
    def nats_url(self) -> str:
        return ",".join(self.servers)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, nats_url: str | None = None, **given: Any
    ) -> ConnectOptions:
        """The services' `TOOLBUS_NATS_*` settings (`NatsAuth.from_env`) and
        `TOOLBUS_SUBJECT_PREFIX` from `env` (default `os.environ`), then `nats_url` and every
        keyword argument that is not None."""
        env = os.environ if env is None else env
        known = {f.name for f in dataclasses.fields(cls)} - {"servers"}
        unknown = sorted(set(given) - known)
        if unknown:
            raise TypeError(f"unknown connect option '{unknown[0]}' (known: {', '.join(sorted(known))})")
        auth = NatsAuth.from_env(env)
        values: dict[str, Any] = {f.name: getattr(auth, f.name) for f in dataclasses.fields(NatsAuth)}
        if raw := env.get("TOOLBUS_SUBJECT_PREFIX"):
            values["prefix"] = raw
        values.update({k: v for k, v in given.items() if v is not None})
        if nats_url:
            values["servers"] = [u.strip() for u in nats_url.split(",") if u.strip()]
        return cls(**values)

    def nats_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `nats.connect(**kwargs)`: the services' builder's
        (`NatsAuth.connect_options`), plus this client's name and connect timeout."""
        return {**self.connect_options(), "name": self.name, "connect_timeout": self.connect_timeout}
