"""How the SDK reaches NATS: the URL, the subject prefix, and the connection's credentials and TLS,
from the same `TOOLBUS_NATS_*` settings, with the same names and the same precedence, as the
services' builder (`toolbus_common.nats_auth.NatsAuth`; a test checks that both give nats-py the
same arguments). Not imported from there: `toolbus_common` brings the services' runtime (Redis,
FastStream, Starlette), ~1 s of import time for every CLI command, measured in design.md."""

from __future__ import annotations

import dataclasses
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toolbus_contracts import DEFAULT_PREFIX

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient

ENV_PREFIX = "TOOLBUS_NATS_"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


@dataclass(frozen=True)
class ConnectOptions:
    """Where and how to connect; the repr never shows a password or token.

    Authentication, at most one sent, in this order of precedence: `creds_file` (JWT + nkey seed),
    `nkey_file`, `user` + `password`, `token`. TLS is on for a `tls://` URL or any TLS file;
    `tls_cert_file` (+ `tls_key_file`) is the client certificate.
    """

    servers: list[str] = field(default_factory=lambda: [DEFAULT_NATS_URL])
    prefix: str = DEFAULT_PREFIX
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
    name: str = "toolbus-sdk"
    connect_timeout: float = 5.0

    @property
    def nats_url(self) -> str:
        return ",".join(self.servers)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, nats_url: str | None = None, **given: Any
    ) -> ConnectOptions:
        """`TOOLBUS_NATS_URL`, `TOOLBUS_SUBJECT_PREFIX` and `TOOLBUS_NATS_<FIELD>` (`USER`,
        `PASSWORD`, `TOKEN`, `CREDS_FILE`, `NKEY_FILE`, `TLS_CA_FILE`, `TLS_CERT_FILE`,
        `TLS_KEY_FILE`, `TLS_SERVER_NAME`, `INBOX_PREFIX`) from `environ` (default `os.environ`),
        then every keyword argument that is not None."""
        env = os.environ if environ is None else environ
        known = {f.name for f in dataclasses.fields(cls)} - {"servers"}
        unknown = sorted(set(given) - known)
        if unknown:
            raise TypeError(f"unknown connect option '{unknown[0]}' (known: {', '.join(sorted(known))})")
        values: dict[str, Any] = {}
        for name in known - {"prefix", "name", "connect_timeout"}:
            if raw := env.get(ENV_PREFIX + name.upper()):
                values[name] = raw
        if raw := env.get("TOOLBUS_SUBJECT_PREFIX"):
            values["prefix"] = raw
        values.update({k: v for k, v in given.items() if v is not None})
        url = nats_url or env.get(ENV_PREFIX + "URL") or DEFAULT_NATS_URL
        return cls(servers=[u.strip() for u in url.split(",") if u.strip()], **values)

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

    def nats_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `nats.connect(**kwargs)`."""
        kwargs: dict[str, Any] = {
            "servers": list(self.servers),
            "inbox_prefix": self.inbox_prefix,
            "name": self.name,
            "connect_timeout": self.connect_timeout,
        }
        if self.creds_file:
            kwargs["user_credentials"] = self.creds_file
        elif self.nkey_file:
            kwargs["nkeys_seed"] = self.nkey_file
        elif self.user:
            kwargs["user"] = self.user
            kwargs["password"] = self.password or ""
        elif self.token:
            kwargs["token"] = self.token
        context = self.ssl_context()
        if context is not None:
            kwargs["tls"] = context
            if self.tls_server_name:
                kwargs["tls_hostname"] = self.tls_server_name
        return kwargs


async def flush(nc: NatsClient) -> None:
    """The same as `toolbus_common.connections.flush` (not imported, see above): `nc.flush()` that also covers the SUB and PUB lines still in nats-py's pending buffer, so
    that once it returns the server has every subscription made before it.

    nats-py 2.16 writes flush()'s PING straight to the socket, while `subscribe()` and `publish()`
    append to a buffer its flusher task writes later: the PONG can come back before the server has
    a subscription made just before (measured: 43 of 2,000 `subscribe(); flush()` on one
    connection followed by a request on another got no responders, 0 of 2,000 with the buffer
    forced out first). `_flush_pending(force_flush=True)` waits for the flusher to write it."""
    force = getattr(nc, "_flush_pending", None)
    if force is not None and nc.is_connected:
        await force(force_flush=True)
    await nc.flush()
