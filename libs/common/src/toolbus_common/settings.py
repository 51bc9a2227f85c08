"""Settings from `TOOLBUS_*` environment variables, read in an app factory, never at import time."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from toolbus_contracts import DEFAULT_PREFIX, PREFIX_PATTERN, Subjects

from toolbus_common.egress import EgressPolicy

REDIS_LONGEST_BLOCK = 1.0
"""Seconds of the longest blocking Redis command the services send: the dispatcher's event relay
reads its outbox with `XREAD ... BLOCK` of at most 1000 ms. `TOOLBUS_REDIS_SOCKET_TIMEOUT` must
exceed it, or an idle relay's read would time out as a dead connection."""


def stream_name(subject_prefix: str, name: str) -> str:
    """A JetStream stream, KV or object-store name under a subject prefix (which may hold dots and
    other characters stream names refuse: they become `_`)."""
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', subject_prefix)}_{name}"


class Settings(BaseSettings):
    """What every service reads. Secrets are `SecretStr`: they print as `**********`."""

    model_config = SettingsConfigDict(env_prefix="TOOLBUS_", extra="ignore", frozen=True)

    nats_url: str = "nats://127.0.0.1:4222"
    """One server URL or several, comma-separated (a cluster's seed list); `tls://` turns TLS on."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """`redis://` or `rediss://` (TLS); with Sentinel only its scheme, credentials and db are used."""

    # ---- NATS authentication and TLS (see toolbus_nats_connect; any one way to authenticate)
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    nats_token: SecretStr | None = None
    nats_creds_file: str | None = None
    """A `.creds` file (user JWT + nkey seed), for servers run in operator/JWT mode."""
    nats_nkey_file: str | None = None
    """A file holding a user's nkey seed (`SU...`)."""
    nats_tls_ca_file: str | None = None
    """CA bundle the server certificate is checked against (setting any `nats_tls_*` turns TLS on)."""
    nats_tls_cert_file: str | None = None
    """Client certificate, for servers that verify clients (`verify: true`)."""
    nats_tls_key_file: str | None = None
    nats_tls_server_name: str | None = None
    """Name to check the server certificate against when it differs from the URL's host."""
    nats_inbox_prefix: str = "_INBOX"
    """Prefix of this connection's reply subjects; the secured configuration gives each user its
    own (`_INBOX.<user>`) so that no user can subscribe to another's replies."""

    # ---- Redis authentication, TLS and Sentinel
    redis_username: str | None = None
    """Redis ACL user; overrides the URL's."""
    redis_password: SecretStr | None = None
    """Overrides the URL's password (so that it can come from a secret, not a URL)."""
    redis_tls_ca_file: str | None = None
    redis_tls_cert_file: str | None = None
    redis_tls_key_file: str | None = None
    redis_sentinels: str | None = None
    """`host:port,host:port,...`: find the master through these Sentinels (and follow failovers)."""
    redis_sentinel_master: str = "toolbus"
    """The master's name in the Sentinels' configuration."""
    redis_sentinel_password: SecretStr | None = None
    """Password of the Sentinels themselves, where they require one (`requirepass` in sentinel.conf)."""

    # ---- JetStream placement and limits of every stream, KV bucket and object store created
    js_replicas: int = Field(default=1, ge=1, le=5)
    """Replicas of each stream and bucket: 1 on one server, 3 on a 3-node cluster."""
    js_storage: Literal["file", "memory"] = "file"
    js_events_max_age: float = Field(default=7 * 86400.0, gt=0)
    """Seconds an event stays replayable in the EVENTS stream (as long as a closed run is kept)."""
    js_events_max_bytes: int = Field(default=-1, ge=-1)
    """Size limit of the EVENTS stream (oldest events dropped first); -1: none."""
    js_internal_max_age: float = Field(default=30 * 86400.0, gt=0)
    """Seconds a service-to-service command waits in the INTERNAL stream for its consumer."""
    js_max_bytes: int = Field(default=-1, ge=-1)
    """Size limit of each KV bucket and object store (toolsets, workflows, outputs); -1: none."""
    subject_prefix: str = Field(default=DEFAULT_PREFIX, pattern=PREFIX_PATTERN)
    redis_prefix: str | None = None
    secret_key: SecretStr | None = None
    webhook_url: str | None = None
    webhook_secret: SecretStr | None = None
    module_name: str = "rewind:tools"
    registry_max_listing_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    """The registry: the most of one server's tool listing it reads (each answer, and all pages
    together); more is `upstreamError` naming the server."""
    egress_allow: str = ""
    """What toolbus may connect to beyond public addresses (`http.fetch`, MCP servers): a
    comma-separated list of networks (`10.0.0.0/8`), addresses (`::1`) and host names
    (`mcp.corp.internal`, `*.svc.cluster.local`). Empty (the default): loopback, private,
    link-local, metadata, CGNAT, reserved and multicast addresses, and the IPv6 forms carrying
    them, are refused (see `toolbus_common.egress`)."""
    http_host: str = "127.0.0.1"
    http_port: int = 0
    http_fd: int | None = Field(default=None, ge=0)
    """A listening TCP socket handed down by the process that started this one (its descriptor
    number, systemd-style): served instead of binding `http_host:http_port`. toolbus_devstack
    passes one, so a service's port is bound before it starts: no free port to race for."""
    log_level: str = "INFO"
    log_format: str = "auto"
    """`json`, `text`, or `auto` (JSON when stderr is not a TTY)."""
    redis_pool_size: int = Field(default=64, ge=1)
    """Connections in each service's Redis pool; a request waits for a free one (blocking pool)."""
    redis_pool_timeout: float = Field(default=5.0, gt=0)
    """Seconds a request waits for a free Redis connection before it is answered `unavailable`."""
    redis_socket_timeout: float = Field(default=10.0, gt=REDIS_LONGEST_BLOCK)
    """Seconds a Redis command waits for its reply (and a connect for its answer) before it fails
    and its connection is dropped; also the TCP keepalive idle time. On the pooled redis-py client
    and the dispatcher's script pipe; above the longest blocking command (`REDIS_LONGEST_BLOCK`)."""

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinels_are_host_ports(cls, value: str | None) -> str | None:
        for item in (value or "").split(","):
            _, sep, port = item.strip().rpartition(":")
            if item.strip() and sep and not port.isdigit():
                raise ValueError(f"TOOLBUS_REDIS_SENTINELS: {item.strip()!r} is not host:port")
        return value

    @field_validator("egress_allow")
    @classmethod
    def _egress_entries(cls, value: str) -> str:
        EgressPolicy.parse(value)
        return value

    @property
    def egress(self) -> EgressPolicy:
        """The egress policy `egress_allow` describes."""
        return EgressPolicy.parse(self.egress_allow)

    @property
    def nats_servers(self) -> list[str]:
        return [url.strip() for url in self.nats_url.split(",") if url.strip()]

    @property
    def redis_sentinel_addresses(self) -> list[tuple[str, int]]:
        """The Sentinels of `redis_sentinels` as (host, port); empty when Sentinel is not used."""
        out: list[tuple[str, int]] = []
        for item in (self.redis_sentinels or "").split(","):
            host, _, port = item.strip().rpartition(":")
            if item.strip():
                out.append((host.strip("[]") or item.strip(), int(port) if host else 26379))
        return out

    @property
    def subjects(self) -> Subjects:
        return Subjects(self.subject_prefix)

    @property
    def key_prefix(self) -> str:
        """Prefix of every Redis key this deployment writes."""
        return self.redis_prefix or self.subject_prefix

    def js_name(self, name: str) -> str:
        """A JetStream stream, KV or object-store name under this deployment's prefix."""
        return stream_name(self.subject_prefix, name)
