"""Settings of the dispatcher: the common ones plus `TOOLBUS_DISPATCHER_*` and `TOOLBUS_HTTP_*`."""

from __future__ import annotations

from pydantic import Field
from toolbus_common.settings import Settings


class DispatcherSettings(Settings):
    """Everything the dispatcher reads from the environment. Durations are seconds (floats)."""

    dispatcher_lease: float = Field(default=10.0, gt=0)
    """How long a running call's lease and slots last without renewal (renewed every third)."""
    dispatcher_retry_backoff: float = Field(default=0.5, ge=0)
    """First pause before sending an interrupted call again; doubled each attempt."""
    dispatcher_retry_backoff_max: float = Field(default=10.0, ge=0)
    dispatcher_workflow_timeout: float = Field(default=3600.0, gt=0)
    """Limit of one workflow attempt when its policy sets no timeout."""
    dispatcher_run_retention: float = Field(default=7 * 86400.0, gt=0)
    """How long a closed run and its calls stay readable in Redis."""
    dispatcher_consumer: str = "dispatcher"
    """Durable consumer names on the INTERNAL stream start with this (shared by all replicas)."""
    http_max_body: int = Field(default=10 * 1024 * 1024, gt=0)
    """Largest response body the http tool reads; larger is `upstreamError`."""
    http_max_redirects: int = Field(default=10, ge=0)
