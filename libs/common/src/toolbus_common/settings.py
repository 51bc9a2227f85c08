"""Settings from `TOOLBUS_*` environment variables, read in an app factory, never at import time."""

from __future__ import annotations

import re

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from toolbus_contracts import DEFAULT_PREFIX, Subjects


def stream_name(subject_prefix: str, name: str) -> str:
    """A JetStream stream, KV or object-store name under a subject prefix (which may hold dots and
    other characters stream names refuse: they become `_`)."""
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', subject_prefix)}_{name}"


class Settings(BaseSettings):
    """What every service reads. Secrets are `SecretStr`: they print as `**********`."""

    model_config = SettingsConfigDict(env_prefix="TOOLBUS_", extra="ignore", frozen=True)

    nats_url: str = "nats://127.0.0.1:4222"
    redis_url: str = "redis://127.0.0.1:6379/0"
    subject_prefix: str = Field(default=DEFAULT_PREFIX, pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
    redis_prefix: str | None = None
    secret_key: SecretStr | None = None
    webhook_url: str | None = None
    webhook_secret: SecretStr | None = None
    module_name: str = "rewind:tools"
    http_host: str = "127.0.0.1"
    http_port: int = 0
    log_level: str = "INFO"
    log_format: str = "auto"
    """`json`, `text`, or `auto` (JSON when stderr is not a TTY)."""
    redis_pool_size: int = Field(default=64, ge=1)
    """Connections in each service's Redis pool; a request waits for a free one (blocking pool)."""
    redis_pool_timeout: float = Field(default=5.0, gt=0)
    """Seconds a request waits for a free Redis connection before it is answered `unavailable`."""

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
