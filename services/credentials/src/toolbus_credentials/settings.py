"""Settings only the credentials service reads (the shared ones are `toolbus_common.Settings`)."""

from __future__ import annotations

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from toolbus_common.webhooks import WebhookSettings
from toolbus_contracts import parse_duration


class CredentialsSettings(WebhookSettings, BaseSettings):
    """`TOOLBUS_PARK_TIMEOUT` (default 24h): a call parked longer ends `credentialsRejected`.
    `TOOLBUS_PARK_SWEEP_INTERVAL` (default 30s): how often parked calls are checked for that.
    `TOOLBUS_PARK_NOTIFY_DELAY` (default 1s): how long after the first 401 at a scope its
    `credentials.expired` notice goes out, so that a burst of 401s gives one notice.
    `TOOLBUS_WEBHOOK_RETRY_SCHEDULE` (default `5s,30s,2m,10m,1h`), `TOOLBUS_WEBHOOK_TIMEOUT`
    (default 10s): webhook retries and the time one attempt may take (`WebhookSettings`)."""

    model_config = SettingsConfigDict(env_prefix="TOOLBUS_", extra="ignore", frozen=True)

    park_timeout: str = "24h"
    park_sweep_interval: str = "30s"
    park_notify_delay: str = "1s"

    @field_validator("park_timeout", "park_sweep_interval", "park_notify_delay")
    @classmethod
    def _duration(cls, value: str) -> str:
        parse_duration(value)
        return value

    @property
    def park_timeout_seconds(self) -> float:
        return parse_duration(self.park_timeout).total_seconds()

    @property
    def park_sweep_seconds(self) -> float:
        return parse_duration(self.park_sweep_interval).total_seconds()

    @property
    def park_notify_seconds(self) -> float:
        return parse_duration(self.park_notify_delay).total_seconds()
