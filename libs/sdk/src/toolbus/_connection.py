"""How the SDK reaches NATS: the URL, the subject prefix and the connection's credentials and TLS.

`ConnectOptions.from_env()` reads the same `TOOLBUS_*` settings the services read, so a harness
started beside a deployment needs no arguments; every field can be given in code instead.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field, fields, replace
from typing import Any

from pydantic import SecretStr
from toolbus_contracts import DEFAULT_PREFIX

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"

_ENV: dict[str, str] = {
    "nats_url": "TOOLBUS_NATS_URL",
    "prefix": "TOOLBUS_SUBJECT_PREFIX",
    "creds_file": "TOOLBUS_NATS_CREDS",
    "nkey_seed_file": "TOOLBUS_NATS_NKEY_SEED",
    "user": "TOOLBUS_NATS_USER",
    "password": "TOOLBUS_NATS_PASSWORD",
    "token": "TOOLBUS_NATS_TOKEN",
    "tls_ca": "TOOLBUS_NATS_TLS_CA",
    "tls_cert": "TOOLBUS_NATS_TLS_CERT",
    "tls_key": "TOOLBUS_NATS_TLS_KEY",
}
_SECRET = frozenset({"password", "token"})


@dataclass(frozen=True)
class ConnectOptions:
    """Where and how to connect. Secrets are `SecretStr` (they print as `**********`).

    Authentication, at most one kind: `creds_file` (a NATS `.creds` file: JWT and nkey seed),
    `nkey_seed_file`, `user` + `password`, or `token`. TLS: `tls_ca` (a CA bundle to trust),
    `tls_cert` + `tls_key` (a client certificate); either turns TLS on (so does a `tls://` URL).
    """

    nats_url: str = DEFAULT_NATS_URL
    prefix: str = DEFAULT_PREFIX
    name: str = "toolbus-sdk"
    connect_timeout: float = 5.0
    creds_file: str | None = None
    nkey_seed_file: str | None = None
    user: str | None = None
    password: SecretStr | None = None
    token: SecretStr | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Further keyword arguments for `nats.connect`, passed as they are."""

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> ConnectOptions:
        """The `TOOLBUS_*` settings of `environ` (default `os.environ`), then `overrides` where not
        None."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, var in _ENV.items():
            raw = env.get(var)
            if raw:
                values[name] = SecretStr(raw) if name in _SECRET else raw
        known = {f.name for f in fields(cls)}
        for name, value in overrides.items():
            if name not in known:
                raise TypeError(f"unknown connect option '{name}'")
            if value is not None:
                values[name] = SecretStr(value) if name in _SECRET and isinstance(value, str) else value
        return replace(cls(), **values)

    def _tls_context(self) -> ssl.SSLContext | None:
        if not (self.tls_ca or self.tls_cert):
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
        if self.tls_cert:
            context.load_cert_chain(self.tls_cert, self.tls_key)
        return context

    def nats_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `nats.connect` these options stand for."""
        given = [
            kind
            for kind, present in (
                ("creds_file", self.creds_file),
                ("nkey_seed_file", self.nkey_seed_file),
                ("user/password", self.user),
                ("token", self.token),
            )
            if present
        ]
        if len(given) > 1:
            raise ValueError(f"give one kind of NATS authentication, not {' and '.join(given)}")
        kwargs: dict[str, Any] = {
            "servers": [u.strip() for u in self.nats_url.split(",") if u.strip()],
            "name": self.name,
            "connect_timeout": self.connect_timeout,
            "allow_reconnect": True,
        }
        if self.creds_file:
            kwargs["user_credentials"] = self.creds_file
        if self.nkey_seed_file:
            kwargs["nkeys_seed"] = self.nkey_seed_file
        if self.user:
            kwargs["user"] = self.user
            kwargs["password"] = self.password.get_secret_value() if self.password else ""
        if self.token:
            kwargs["token"] = self.token.get_secret_value()
        tls = self._tls_context()
        if tls is not None:
            kwargs["tls"] = tls
        return {**kwargs, **self.extra}
