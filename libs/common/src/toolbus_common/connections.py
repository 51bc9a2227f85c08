"""NATS, JetStream and Redis connections, and idempotent creation of streams and buckets."""

from __future__ import annotations

import dataclasses
import logging
import math
import socket
import ssl
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore
from toolbus_nats_connect import NatsAuth
from toolbus_nats_connect import flush as flush  # the services take it from here

from toolbus_common.outages import REDIS
from toolbus_common.script_pipe import ScriptPipe
from toolbus_common.settings import Settings

if TYPE_CHECKING:
    from redis.asyncio import Redis

# redis-py is imported where a Redis client is made, not with this module: importing it costs a
# process ~19 MiB resident, and the registry, which never talks to Redis, imports this module.

log = logging.getLogger(__name__)


def nats_auth(settings: Settings) -> NatsAuth:
    """The connection's servers, credentials and TLS from `TOOLBUS_NATS_*` settings."""
    return NatsAuth(
        servers=settings.nats_servers,
        user=settings.nats_user,
        password=settings.nats_password.get_secret_value() if settings.nats_password else None,
        token=settings.nats_token.get_secret_value() if settings.nats_token else None,
        creds_file=settings.nats_creds_file,
        nkey_file=settings.nats_nkey_file,
        tls_ca_file=settings.nats_tls_ca_file,
        tls_cert_file=settings.nats_tls_cert_file,
        tls_key_file=settings.nats_tls_key_file,
        tls_server_name=settings.nats_tls_server_name,
        inbox_prefix=settings.nats_inbox_prefix,
    )


def nats_connect_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of `nats.connect` (and FastStream's `NatsBroker`) for these settings:
    servers, authentication, TLS and the inbox prefix (see `toolbus_nats_connect.NatsAuth`)."""
    return nats_auth(settings).connect_options()


def nats_options(settings: Settings, name: str) -> dict[str, Any]:
    """Connection options of every service (`nats.connect` and FastStream's `NatsBroker` take
    them): servers, authentication, TLS and inbox (`nats_connect_options`), endless reconnects (to
    any server of the list, so a cluster node's loss is ridden out); connection changes are
    logged, never raised into handlers."""

    async def on_error(exc: Exception) -> None:
        log.warning("nats error", extra={"error": type(exc).__name__, "detail": str(exc)})

    async def on_disconnect() -> None:
        log.warning("nats disconnected")

    async def on_reconnect() -> None:
        log.info("nats reconnected")

    return {
        **nats_connect_options(settings),
        "name": name,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "error_cb": on_error,
        "disconnected_cb": on_disconnect,
        "reconnected_cb": on_reconnect,
    }


def redis_uses_tls(settings: Settings) -> bool:
    return urlsplit(settings.redis_url).scheme == "rediss" or bool(
        settings.redis_tls_ca_file or settings.redis_tls_cert_file
    )


def redis_ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context of a Redis connection (CA, client certificate), None without TLS."""
    if not redis_uses_tls(settings):
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=settings.redis_tls_ca_file)
    if settings.redis_tls_cert_file:
        context.load_cert_chain(settings.redis_tls_cert_file, settings.redis_tls_key_file)
    return context


def _redis_auth(settings: Settings) -> tuple[str | None, str | None]:
    parts = urlsplit(settings.redis_url)
    username = settings.redis_username or (unquote(parts.username) if parts.username else None)
    if settings.redis_password is not None:
        password: str | None = settings.redis_password.get_secret_value()
    else:
        password = unquote(parts.password) if parts.password else None
    return username, password


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return parts._replace(netloc=host).geturl()


def _redis_tls_options(settings: Settings) -> dict[str, Any]:
    if not redis_uses_tls(settings):
        return {}
    return {
        "ssl_ca_certs": settings.redis_tls_ca_file,
        "ssl_certfile": settings.redis_tls_cert_file,
        "ssl_keyfile": settings.redis_tls_key_file,
    }


@cache
def _client_class() -> type[Any]:
    """The client class of `connect_redis`, made on first use."""
    from redis.asyncio import Redis

    class _ProbedRedis(Redis):  # type: ignore[type-arg]
        """A client whose PING `outages.REDIS` may ask while Redis is away, until it is closed."""

        async def aclose(self, close_connection_pool: bool | None = None) -> None:
            await REDIS.forget(self.ping)
            await super().aclose(close_connection_pool)  # type: ignore[misc]

    return _ProbedRedis


@cache
def _sentinel_classes() -> tuple[type[Any], type[Any]]:
    """(pool, client) classes for a Sentinel-located master, made on first use."""
    from redis.asyncio import BlockingConnectionPool
    from redis.asyncio.sentinel import SentinelConnectionPool

    class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):  # type: ignore[type-arg]
        """Sentinel's master-following pool with the blocking pool's bounded wait."""

    class _SentinelRedis(_client_class()):  # type: ignore[misc]
        """A client of the Sentinel-located master that also closes its Sentinel connections."""

        owned_sentinel: Any = None

        async def aclose(self, close_connection_pool: bool | None = None) -> None:
            await super().aclose(close_connection_pool)
            if self.owned_sentinel is not None:
                await self.owned_sentinel.aclose()

    return _BlockingSentinelPool, _SentinelRedis


def redis_socket_options(settings: Settings) -> dict[str, Any]:
    """Socket options of every pooled redis-py connection: a command whose reply has not come
    within `TOOLBUS_REDIS_SOCKET_TIMEOUT` fails (`redis.exceptions.TimeoutError`, answered
    `unavailable`) and its connection is dropped, instead of waiting forever on a peer that went
    silent; TCP keepalive probes an idle pooled connection after the same time (3 probes, a third
    of it apart), so a dead one is found before a command is put on it. The timeout is above every
    blocking command's block time (`REDIS_LONGEST_BLOCK`, the settings check it)."""
    timeout = settings.redis_socket_timeout
    keepalive: dict[int, int] = {}
    for option, value in (
        ("TCP_KEEPIDLE", math.ceil(timeout)),
        ("TCP_KEEPINTVL", max(1, math.ceil(timeout / 3))),
        ("TCP_KEEPCNT", 3),
    ):
        if hasattr(socket, option):  # Linux has all three; other platforms may lack some
            keepalive[getattr(socket, option)] = value
    return {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "socket_keepalive": True,
        "socket_keepalive_options": keepalive,
    }


def connect_redis(settings: Settings) -> Redis[bytes]:
    """An asyncio Redis client returning bytes on a bounded, blocking pool: under load a command
    waits up to `redis_pool_timeout` for a connection instead of failing at once (redis-py's
    default pool raises `MaxConnectionsError` when its 100 connections are busy).

    Password and user from `TOOLBUS_REDIS_PASSWORD`/`_USERNAME` (else the URL), TLS with
    `rediss://` or the `TOOLBUS_REDIS_TLS_*` files. With `TOOLBUS_REDIS_SENTINELS` the master is
    found through the Sentinels and found again after a failover (a connection that meets
    `READONLY` or a refused connect asks the Sentinels again). Every connection has the socket
    timeout and keepalive of `redis_socket_options`.

    A pooled connection the server closed (a restart) is connected again when it is taken from
    the pool, before a command is written on it. A command is never sent twice: one that failed
    after it was written may have been applied, so it fails (`unavailable`). The client's PING is
    the probe that ends an outage of `outages.REDIS`."""
    from redis.asyncio import BlockingConnectionPool
    from redis.asyncio.sentinel import Sentinel
    from redis.maint_notifications import MaintNotificationsConfig

    username, password = _redis_auth(settings)
    options: dict[str, Any] = {
        "max_connections": settings.redis_pool_size,
        "timeout": settings.redis_pool_timeout,
        "decode_responses": False,
        "health_check_interval": 30,
        # No `CLIENT SETINFO` on connect: the services' ACL users may not send it
        # (toolbus_devstack.redis_acl); redis-py would ignore the refusal but Redis logs each one.
        "driver_info": None,
        # Off, so that the pool looks at an idle connection when it is taken: one the server
        # closed (a restart) is connected again before a command is written on it. redis-py 8's
        # default ("auto", for Redis Enterprise's maintenance notices) skips that look, and every
        # pooled connection failed its first command after a restart.
        "maint_notifications_config": MaintNotificationsConfig(enabled=False),
        **redis_socket_options(settings),
        **_redis_tls_options(settings),
    }
    if username:
        options["username"] = username
    if password is not None:
        options["password"] = password
    sentinels = settings.redis_sentinel_addresses
    if sentinels:
        sentinel_options: dict[str, Any] = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
        if settings.redis_sentinel_password is not None:
            sentinel_options["password"] = settings.redis_sentinel_password.get_secret_value()
        if redis_uses_tls(settings):
            sentinel_options.update(ssl=True, **_redis_tls_options(settings))
        sentinel = Sentinel(sentinels, sentinel_kwargs=sentinel_options)
        pool_class, redis_class = _sentinel_classes()
        db = int(urlsplit(settings.redis_url).path.lstrip("/") or 0)
        client = sentinel.master_for(
            settings.redis_sentinel_master,
            redis_class=redis_class,
            connection_pool_class=pool_class,
            db=db,
            ssl=redis_uses_tls(settings),
            **{**options, "socket_connect_timeout": 2.0},
        )
        client.owned_sentinel = sentinel
        sentinel_client: Redis[bytes] = client
        REDIS.watch(sentinel_client.ping)
        return sentinel_client
    # redis-py lets a URL's user and password win over the keyword arguments: the URL goes
    # without them, so `TOOLBUS_REDIS_USERNAME`/`_PASSWORD` win, as `_redis_auth` says.
    pool: BlockingConnectionPool[Any] = BlockingConnectionPool.from_url(
        _without_userinfo(settings.redis_url), **options
    )
    # The client owns the pool and closes it with itself (stubs predate `from_pool`).
    plain: Redis[bytes] = _client_class().from_pool(pool)
    REDIS.watch(plain.ping)
    return plain


def connect_script_pipe(
    settings: Settings, redis: Redis[bytes] | None = None, *, reply_timeout: float | None = None
) -> ScriptPipe:
    """The dispatcher's hot-path pipe with the same password, TLS and master as `connect_redis`:
    under Sentinel it asks `redis`'s Sentinel pool for the master on every (re)connect.
    `reply_timeout`: seconds a silent connection may keep commands waiting before they fail (and
    are retried on a new connection); default `TOOLBUS_REDIS_SOCKET_TIMEOUT`, as the pool's."""
    from redis.asyncio.sentinel import SentinelConnectionPool

    username, password = _redis_auth(settings)
    locate = None
    if redis is not None and isinstance(redis.connection_pool, SentinelConnectionPool):
        locate = redis.connection_pool.get_master_address
    elif settings.redis_sentinel_addresses:
        raise ValueError("with TOOLBUS_REDIS_SENTINELS, pass the Sentinel client from connect_redis")
    return ScriptPipe(
        settings.redis_url,
        username=username,
        password=password,
        ssl=redis_ssl_context(settings),
        locate=locate,
        reply_timeout=settings.redis_socket_timeout if reply_timeout is None else reply_timeout,
    )


@dataclass(frozen=True, slots=True)
class JsPlacement:
    """Where and how big every stream, KV bucket and object store is: replicas and storage from
    `TOOLBUS_JS_REPLICAS`/`TOOLBUS_JS_STORAGE`, `max_bytes` for buckets from `TOOLBUS_JS_MAX_BYTES`.
    The default (R1, file, unlimited) is what a single server needs."""

    replicas: int = 1
    storage: StorageType = StorageType.FILE
    max_bytes: int = -1

    @classmethod
    def of(cls, settings: Settings) -> JsPlacement:
        return cls(
            replicas=settings.js_replicas,
            storage=StorageType(settings.js_storage),
            max_bytes=settings.js_max_bytes,
        )


DEFAULT_PLACEMENT = JsPlacement()


def events_stream_limits(settings: Settings) -> dict[str, Any]:
    """`ensure_stream` keyword arguments of the EVENTS stream: its age and size limits."""
    return {
        "max_age": timedelta(seconds=settings.js_events_max_age),
        "max_bytes": settings.js_events_max_bytes,
        "placement": JsPlacement.of(settings),
        # Clients read events with direct gets only (deploy/nats: the one JetStream request a
        # client's account imports).
        "allow_direct": True,
    }


def internal_stream_limits(settings: Settings) -> dict[str, Any]:
    """`ensure_stream` keyword arguments of the INTERNAL stream."""
    return {"max_age": timedelta(seconds=settings.js_internal_max_age), "placement": JsPlacement.of(settings)}


def _log_storage_mismatch(name: str, have: StreamConfig, placement: JsPlacement) -> None:
    if have.storage != placement.storage:
        log.warning(
            "stream storage differs from settings", extra={"stream": name, "storage": str(have.storage)}
        )


async def ensure_stream(
    js: JetStreamContext,
    name: str,
    subjects: list[str],
    *,
    max_age: timedelta | None = None,
    retention: RetentionPolicy = RetentionPolicy.LIMITS,
    max_bytes: int = -1,
    placement: JsPlacement = DEFAULT_PLACEMENT,
    allow_direct: bool = False,
) -> None:
    """Create the stream, or update its subjects, limits, replicas and direct gets where they
    differ (storage cannot change on a live stream: a mismatch is logged); works on JetStream 2.9."""
    config = StreamConfig(
        name=name,
        subjects=subjects,
        retention=retention,
        storage=placement.storage,
        num_replicas=placement.replicas,
        max_age=max_age.total_seconds() if max_age else None,
        max_bytes=max_bytes,
        allow_direct=allow_direct,
    )
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        await js.add_stream(config)
        return
    have = info.config
    _log_storage_mismatch(name, have, placement)
    want_age = config.max_age or 0.0
    if (
        sorted(have.subjects or []) != sorted(subjects)
        or (have.num_replicas or 1) != placement.replicas
        or abs((have.max_age or 0.0) - want_age) > 1e-3
        or (have.max_bytes if have.max_bytes is not None else -1) != max_bytes
        or bool(have.allow_direct) != allow_direct
    ):
        config.storage = have.storage
        await js.update_stream(config)


async def align_bucket_stream(
    js: JetStreamContext, stream: str, placement: JsPlacement, *, max_age: float | None = None
) -> None:
    """Bring the stream behind an existing KV bucket (`KV_<bucket>`) or object store
    (`OBJ_<bucket>`) to the settings: replicas and `max_bytes` from `placement`, and `max_age`
    (an object store's TTL, seconds) when given, updated where they differ; every other field of
    the bucket's stream is kept as the server has it. Storage cannot change on a live stream: a
    mismatch is logged. Works on JetStream 2.9 (an R1 stream scales to R3 in place)."""
    have = (await js.stream_info(stream)).config
    _log_storage_mismatch(stream, have, placement)
    changes: dict[str, Any] = {}
    if (have.num_replicas or 1) != placement.replicas:
        changes["num_replicas"] = placement.replicas
    if (have.max_bytes if have.max_bytes is not None else -1) != placement.max_bytes:
        changes["max_bytes"] = placement.max_bytes
    if max_age is not None and abs((have.max_age or 0.0) - max_age) > 1e-3:
        changes["max_age"] = max_age
    if changes:
        log.info("bucket updated to settings", extra={"stream": stream, **changes})
        await js.update_stream(dataclasses.replace(have, **changes))


async def ensure_kv(
    js: JetStreamContext, bucket: str, *, history: int = 1, placement: JsPlacement = DEFAULT_PLACEMENT
) -> KeyValue:
    """The KV bucket, created with `placement`, or brought to it (`align_bucket_stream`)."""
    try:
        kv = await js.key_value(bucket)
    except (BucketNotFoundError, NotFoundError):
        return await js.create_key_value(
            bucket=bucket,
            history=history,
            storage=placement.storage,
            replicas=placement.replicas,
            max_bytes=placement.max_bytes,
        )
    await align_bucket_stream(js, f"KV_{bucket}", placement)
    return kv


async def ensure_object_store(
    js: JetStreamContext,
    bucket: str,
    *,
    placement: JsPlacement = DEFAULT_PLACEMENT,
    ttl: float | None = None,
) -> ObjectStore:
    """The object store, created with `placement` (and `ttl`, seconds an object is kept, if given),
    or brought to them (`align_bucket_stream`; without `ttl` an existing one keeps its own)."""
    try:
        store = await js.object_store(bucket)
    except (BucketNotFoundError, NotFoundError):
        config = ObjectStoreConfig(
            ttl=ttl, storage=placement.storage, replicas=placement.replicas, max_bytes=placement.max_bytes
        )
        return await js.create_object_store(bucket, config=config)
    await align_bucket_stream(js, f"OBJ_{bucket}", placement, max_age=ttl)
    return store
