"""Settings of the dispatcher: the common ones plus `TOOLBUS_DISPATCHER_*` and `TOOLBUS_HTTP_*`."""

from __future__ import annotations

from pydantic import Field, model_validator
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
    dispatcher_relay_lock_ttl: float = Field(default=3.0, gt=0)
    """TTL of the lock that makes one replica the event relay (renewed every third of it); a dead
    relay is replaced within about this plus a third."""
    dispatcher_consumer: str = "dispatcher"
    """Durable consumer names on the INTERNAL stream start with this (shared by all replicas)."""
    max_output_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    """`TOOLBUS_MAX_OUTPUT_BYTES`: the most a tool may answer (an MCP body, an http.fetch body);
    reading stops there and the call ends with `outputTooLarge`."""
    dispatcher_inline_output_bytes: int | None = Field(default=None, gt=0)
    """Largest outcome sent inline; larger ones keep their output in the `‹P›_outputs` object
    store. Default, and most: what fits in one NATS message (the server's max_payload) less 16 KiB;
    a larger value is lowered to that at start (with a warning)."""
    dispatcher_output_ttl: float | None = Field(default=None, gt=0)
    """How long a stored output is kept from when it was stored (see `output_ttl`): at least
    `dispatcher_run_retention` (refused at start otherwise)."""
    dispatcher_output_memory: int = Field(default=256 * 1024 * 1024, gt=0)
    """Bytes of memory that large outputs (answers over 1 MiB) in flight may hold in all: each
    reserves three times its answer's size (four times an http.fetch body's) until its outcome is
    stored; a call whose share does not fit waits (within its timeout), then completes. A single
    answer larger than the bound reserves all of it and runs alone. See `output_memory`."""
    http_max_body: int | None = Field(default=None, gt=0)
    """Largest response body the http tool reads (default: `max_output_bytes`); larger is
    `outputTooLarge`."""
    http_max_redirects: int = Field(default=10, ge=0)
    http_max_headers: int = Field(default=100, ge=1)
    """The most request headers one `http.fetch` may give; more is `invalidInput`, nothing sent."""
    http_max_header_bytes: int = Field(default=64 * 1024, ge=1)
    """The most bytes those headers may hold in all (`name: value` lines); more is `invalidInput`."""

    @model_validator(mode="after")
    def _outputs_outlive_records(self) -> DispatcherSettings:
        if (
            self.dispatcher_output_ttl is not None
            and self.dispatcher_output_ttl < self.dispatcher_run_retention
        ):
            raise ValueError(
                "TOOLBUS_DISPATCHER_OUTPUT_TTL must be at least TOOLBUS_DISPATCHER_RUN_RETENTION: "
                "an output would be gone while its call's record still points at it"
            )
        return self

    @property
    def output_ttl(self) -> float:
        """The stored outputs' TTL: `dispatcher_output_ttl`, else the run retention plus
        `OPEN_RUN_ALLOWANCE` (30 days with the default 7-day retention)."""
        if self.dispatcher_output_ttl is not None:
            return self.dispatcher_output_ttl
        return self.dispatcher_run_retention + OPEN_RUN_ALLOWANCE


OPEN_RUN_ALLOWANCE = 23 * 86400.0
"""How long after an output was stored its run may stay open and the output still outlive the
call's record (the record lasts until the run is closed plus the run retention)."""
