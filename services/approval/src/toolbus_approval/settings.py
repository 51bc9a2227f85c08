"""Settings only the approval service reads (the shared ones are `toolbus_common.Settings`)."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from toolbus_common.webhooks import WebhookSettings
from toolbus_contracts.base import Duration, parse_duration


class ApprovalSettings(WebhookSettings, BaseSettings):
    """`TOOLBUS_APPROVAL_TIMEOUT` (a duration; unset: approvals never expire),
    `TOOLBUS_APPROVAL_SWEEP_INTERVAL` (seconds between expiry/outbox sweeps),
    `TOOLBUS_APPROVAL_TRUST_REQUEST_INFO` (deciders named by the NATS user; see `identity`),
    `TOOLBUS_WEBHOOK_RETRY_SCHEDULE` and `TOOLBUS_WEBHOOK_TIMEOUT` (`WebhookSettings`)."""

    model_config = SettingsConfigDict(env_prefix="TOOLBUS_", extra="ignore", frozen=True)

    approval_timeout: Duration | None = None
    approval_sweep_interval: float = Field(default=1.0, gt=0, le=60)
    approval_trust_request_info: bool = False
    """Name deciders by the `Nats-Request-Info` header nats-server adds under the accounts
    configuration (`toolbus_approval.identity`); only safe where that configuration runs."""

    @property
    def timeout(self) -> timedelta | None:
        return None if self.approval_timeout is None else parse_duration(self.approval_timeout)
