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
    (default 10s): webhook retries and the time one attempt may take (`WebhookSettings`).
    `TOOLBUS_OAUTH_CALLBACK_URL` (unset: OAuth authorization-code connections refused), the public
    URL of `/oauth/callback` (`/oauth/start/<token>` links are served beside it, and, when it is
    HTTPS, the Client ID Metadata Document `/oauth/client-metadata.json`);
    `TOOLBUS_OAUTH_LINK_TTL` (24h): how long a connect link is good for (single-use);
    `TOOLBUS_OAUTH_STATE_TTL` (10m): how long the user has, once the link is opened, to come back; `TOOLBUS_OAUTH_REFRESH_MARGIN` (60s): how long before expiry a token is renewed (plus
    up to 20% jitter); `TOOLBUS_OAUTH_REFRESH_INTERVAL` (1s): how often due tokens are looked for;
    `TOOLBUS_OAUTH_CLIENT_NAME` (toolbus): the name dynamic registration gives."""

    model_config = SettingsConfigDict(env_prefix="TOOLBUS_", extra="ignore", frozen=True)

    park_timeout: str = "24h"
    park_sweep_interval: str = "30s"
    park_notify_delay: str = "1s"
    oauth_callback_url: str | None = None
    """The public URL of this service's `/oauth/callback` (what the authorization server redirects
    the end user to, registered with it as the redirect URI); unset: no authorization-code flows."""
    oauth_state_ttl: str = "10m"
    oauth_link_ttl: str = "24h"
    oauth_refresh_margin: str = "60s"
    oauth_refresh_interval: str = "1s"
    oauth_client_name: str = "toolbus"

    @field_validator(
        "park_timeout",
        "park_sweep_interval",
        "park_notify_delay",
        "oauth_state_ttl",
        "oauth_link_ttl",
        "oauth_refresh_margin",
        "oauth_refresh_interval",
    )
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
    def oauth_state_seconds(self) -> float:
        return parse_duration(self.oauth_state_ttl).total_seconds()

    @property
    def oauth_link_seconds(self) -> float:
        return parse_duration(self.oauth_link_ttl).total_seconds()

    @property
    def oauth_margin_seconds(self) -> float:
        return parse_duration(self.oauth_refresh_margin).total_seconds()

    @property
    def oauth_interval_seconds(self) -> float:
        return parse_duration(self.oauth_refresh_interval).total_seconds()

    @property
    def park_notify_seconds(self) -> float:
        return parse_duration(self.park_notify_delay).total_seconds()
