"""Which exceptions mean "a backing store did not answer" rather than "toolbus has a bug".

A request that fails on one of these is answered `unavailable` (retryable: nothing was changed,
send it again), never `internal`, which is kept for bugs.
"""

from __future__ import annotations

import sys
from functools import cache

import nats.errors
import nats.js.errors
from toolbus_contracts.errors import Unavailable

from toolbus_common.script_pipe import PipeConnectionError, ScriptReplyError

_OTHER_FAULTS: tuple[type[BaseException], ...] = (
    PipeConnectionError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,  # JetStream API with no JetStream behind it
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,
)


@cache
def _redis_faults() -> tuple[type[BaseException], ...]:
    import redis.exceptions

    return (
        redis.exceptions.ConnectionError,  # includes MaxConnectionsError (pool exhausted)
        redis.exceptions.TimeoutError,
        redis.exceptions.BusyLoadingError,
        redis.exceptions.ReadOnlyError,  # a replica being promoted after a failover
        redis.exceptions.TryAgainError,
        redis.exceptions.MasterDownError,
    )


def backing_store_faults() -> tuple[type[BaseException], ...]:
    """The exception classes of a Redis or NATS/JetStream outage. redis-py's are included once
    redis-py is imported (a process that never imported it cannot meet them: importing it only
    to test against them would cost the registry ~19 MiB)."""
    if "redis.exceptions" in sys.modules:
        return _redis_faults() + _OTHER_FAULTS
    return _OTHER_FAULTS


TRANSIENT_REPLIES = (
    "LOADING",
    "BUSY",
    "READONLY",
    "MASTERDOWN",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "NOREPLICAS",
)
"""Redis error replies that mean "not now" (a restart loading its data, a failover, a master with
`min-replicas-to-write` that has too few replicas keeping up), as the script pipe reports them.
redis-py maps most to the exception classes above; `NOREPLICAS` it raises as a plain
`ResponseError`, so that is matched by its text too."""


def _is_transient_reply(exc: BaseException) -> bool:
    if isinstance(exc, ScriptReplyError):
        return str(exc).startswith(TRANSIENT_REPLIES)
    if "redis.exceptions" in sys.modules:
        import redis.exceptions

        return isinstance(exc, redis.exceptions.ResponseError) and str(exc).startswith(TRANSIENT_REPLIES)
    return False


def is_backing_store_fault(exc: BaseException) -> bool:
    """True when `exc` (or what it was raised from) is a Redis or NATS/JetStream outage."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, backing_store_faults()):
            return True
        if _is_transient_reply(current):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def unavailable(exc: BaseException) -> Unavailable:
    """The `unavailable` reply for a backing-store fault; the store is named, its error is not
    quoted (it may carry a host name or a URL with a password)."""
    store = "Redis" if is_redis_fault(exc) else "NATS JetStream"
    return Unavailable(
        f"{store} did not answer in time; nothing was changed, send the request again.",
        details={"store": store},
    )


def is_redis_fault(exc: BaseException) -> bool:
    """Whether `exc` (or what it was raised from) is an error of a Redis client."""
    current: BaseException | None = exc
    while current is not None:
        if isinstance(current, PipeConnectionError | ScriptReplyError):
            return True
        redis_exceptions = sys.modules.get("redis.exceptions")
        if redis_exceptions is not None and isinstance(current, redis_exceptions.RedisError):
            return True
        current = current.__cause__ or current.__context__
    return False
