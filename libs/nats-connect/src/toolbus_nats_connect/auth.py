"""How a client authenticates to NATS and checks its TLS: the one builder of `nats.connect` options
for the services (`toolbus_common.connections`), the SDK and the CLI (`toolbus.ConnectOptions`),
from `TOOLBUS_NATS_*` settings.

`NatsAuth` holds the settings as plain values (no pydantic) so a client library can fill it from
its own arguments or from the environment (`NatsAuth.from_env()`); `connect_options()` turns it
into keyword arguments of `nats.connect` (FastStream's `NatsBroker(...)` takes the same names).

Ways to authenticate (the server decides which it accepts; at most one is sent, in this order of
precedence): a `.creds` file (JWT + nkey seed), an nkey seed file, user and password, a token.
TLS is on when the URL says `tls://` or any TLS file is given; a client certificate is sent when
`tls_cert_file` is set (servers with `verify: true` require one).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ENV_PREFIX = "TOOLBUS_NATS_"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


@dataclass(frozen=True, slots=True)
class NatsAuth:
    """Credentials and TLS of one NATS connection; the repr never shows a password or token."""

    servers: list[str] = field(default_factory=lambda: [DEFAULT_NATS_URL])
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    creds_file: str | None = None
    nkey_file: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_server_name: str | None = None
    inbox_prefix: str = "_INBOX"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NatsAuth:
        """The `TOOLBUS_NATS_*` variables (`URL`, `USER`, `PASSWORD`, `TOKEN`, `CREDS_FILE`,
        `NKEY_FILE`, `TLS_CA_FILE`, `TLS_CERT_FILE`, `TLS_KEY_FILE`, `TLS_SERVER_NAME`,
        `INBOX_PREFIX`), the same names the services read."""
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(ENV_PREFIX + name)
            return value if value else None

        url = get("URL") or DEFAULT_NATS_URL
        return cls(
            servers=[u.strip() for u in url.split(",") if u.strip()],
            user=get("USER"),
            password=get("PASSWORD"),
            token=get("TOKEN"),
            creds_file=get("CREDS_FILE"),
            nkey_file=get("NKEY_FILE"),
            tls_ca_file=get("TLS_CA_FILE"),
            tls_cert_file=get("TLS_CERT_FILE"),
            tls_key_file=get("TLS_KEY_FILE"),
            tls_server_name=get("TLS_SERVER_NAME"),
            inbox_prefix=get("INBOX_PREFIX") or "_INBOX",
        )

    @property
    def uses_tls(self) -> bool:
        return bool(
            self.tls_ca_file or self.tls_cert_file or any(s.startswith("tls://") for s in self.servers)
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client TLS context checking the server against `tls_ca_file` (else the system CAs),
        with the client certificate when given; None when TLS is off."""
        if not self.uses_tls:
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca_file)
        if self.tls_cert_file:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        return context

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for `nats.connect(**options)`: servers, authentication, TLS, inbox."""
        options: dict[str, Any] = {"servers": list(self.servers), "inbox_prefix": self.inbox_prefix}
        if self.creds_file:
            options["user_credentials"] = self.creds_file
        elif self.nkey_file:
            options["nkeys_seed"] = self.nkey_file
        elif self.user:
            options["user"] = self.user
            options["password"] = self.password or ""
        elif self.token:
            options["token"] = self.token
        context = self.ssl_context()
        if context is not None:
            options["tls"] = context
            if self.tls_server_name:
                options["tls_hostname"] = self.tls_server_name
        return options
