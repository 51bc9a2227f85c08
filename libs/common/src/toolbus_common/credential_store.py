"""Credentials per level (toolset, namespace, run), encrypted in Redis, and their resolution.

A call to server S uses S's headers from the most specific level that has an entry for S: the
run's, then its namespace's, then the toolset's; headers of two levels are never merged. Every
change bumps one version counter in the same transaction, so a reader that knows the counter
(the dispatcher reads it in the Lua script it runs per call anyway) can serve resolutions from
memory with no I/O and still see a change on the very next call.

Layout: one Redis string per level and scope (`Keys.credentials`), holding the Fernet ciphertext
of `{"servers": {name: {"headers": {...}}}}`. Scopes: the toolset id; `<toolsetId>:<namespace>`
(toolset ids never contain `:`); the run id.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError
from toolbus_contracts.credentials import CredentialLevel, Credentials

from toolbus_common.keys import Keys
from toolbus_common.redis_values import text
from toolbus_common.secrets import Cipher, DecryptionError

log = logging.getLogger(__name__)

LEVELS: tuple[CredentialLevel, ...] = ("run", "namespace", "toolset")
"""Most specific first: the order resolution looks at."""

_Doc = dict[str, dict[str, str]]
"""A decrypted credentials document: server -> header name -> value."""

_UNREADABLE: _Doc = {}
"""Stands for a stored document no configured key decrypts (compared by identity)."""


class UnreadableCredentials(Exception):
    """The credentials stored at `level` (the most specific level with a document) cannot be
    decrypted with any `TOOLBUS_SECRET_KEY` entry: they count as present, so resolution never
    falls back to a less specific level's headers (another identity); the caller treats them as
    expired (the call is parked until they are set again)."""

    def __init__(self, level: CredentialLevel) -> None:
        super().__init__(f"the stored {level} credentials cannot be decrypted with the configured keys")
        self.level = level


def scope_of(
    level: CredentialLevel, *, toolset_id: str | None, namespace: str | None, run_id: str | None
) -> str:
    """The scope string of `level` (see module docstring); `ValueError` when a part is missing."""
    if level == "toolset":
        if not toolset_id:
            raise ValueError("toolset level needs toolset_id")
        return toolset_id
    if level == "namespace":
        if not toolset_id or not namespace:
            raise ValueError("namespace level needs toolset_id and namespace")
        return f"{toolset_id}:{namespace}"
    if not run_id:
        raise ValueError("run level needs run_id")
    return run_id


def index_encrypted(pipe: Pipeline[bytes], keys: Keys, key: str, *, ttl_ms: int | None = None) -> None:
    """Queue on `pipe` (with the write of `key`) what makes `CredentialStore.rotate` re-encrypt
    the record at `key`: every service that stores a ciphertext under `TOOLBUS_SECRET_KEY`
    indexes it so. `ttl_ms`: the record expires (it is indexed until then)."""
    if ttl_ms is None:
        pipe.sadd(keys.credentials_index, key)
        return
    now = int(time.time() * 1000)
    pipe.zadd(keys.credentials_index_expiring, {key: now + ttl_ms})
    pipe.zremrangebyscore(keys.credentials_index_expiring, "-inf", now)


def unindex_encrypted(pipe: Pipeline[bytes], keys: Keys, key: str) -> None:
    """Queue on `pipe` (with the deletion of `key`) its removal from the rotation's indexes."""
    pipe.srem(keys.credentials_index, key)
    pipe.zrem(keys.credentials_index_expiring, key)


@dataclass(frozen=True, slots=True)
class Resolved:
    """The headers to send to one server and the level they came from (`None`: no level has an
    entry for the server, headers empty). The repr never shows header values."""

    headers: dict[str, str] = field(repr=False)
    level: CredentialLevel | None

    def __repr__(self) -> str:
        return f"Resolved(level={self.level!r}, headers=<{len(self.headers)} hidden>)"


NOTHING = Resolved({}, None)


class CredentialStore:
    """Encrypted credentials in Redis with a version-checked in-process cache.

    `set`/`delete_run` write ciphertext only and bump `version_key` atomically with the write.
    `resolve(version=v)` does no I/O while `v` is the version the cache was filled at.
    """

    def __init__(self, redis: Redis[bytes], keys: Keys, cipher: Cipher, *, cache_size: int = 10_000) -> None:
        self._redis = redis
        self._keys = keys
        self._cipher = cipher
        self._cache: OrderedDict[str, _Doc | None] = OrderedDict()
        self._cache_version: int | None = None
        self._cache_size = cache_size

    @property
    def version_key(self) -> str:
        """The Redis counter bumped on every change (read it with GET; absent means 0)."""
        return self._keys.credentials_version

    async def version(self) -> int:
        raw = await self._redis.get(self.version_key)
        return int(raw) if raw is not None else 0

    def key(
        self,
        level: CredentialLevel,
        *,
        toolset_id: str | None = None,
        namespace: str | None = None,
        run_id: str | None = None,
    ) -> str:
        return self._keys.credentials(
            level, scope_of(level, toolset_id=toolset_id, namespace=namespace, run_id=run_id)
        )

    # ---- writes ----------------------------------------------------------------------------------

    async def set(
        self,
        level: CredentialLevel,
        *,
        toolset_id: str,
        namespace: str | None = None,
        run_id: str | None = None,
        credentials: Credentials,
    ) -> int:
        """Replace everything stored at `level` and its scope with `credentials`; returns the new
        version. Only ciphertext reaches Redis."""
        key = self.key(level, toolset_id=toolset_id, namespace=namespace, run_id=run_id)
        ciphertext = self._cipher.encrypt(credentials.model_dump_json().encode())
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(key, ciphertext)
            pipe.incr(self.version_key)
            index_encrypted(pipe, self._keys, key)
            results = await pipe.execute()
        return int(results[1])

    async def set_server(
        self,
        level: CredentialLevel,
        *,
        toolset_id: str,
        namespace: str | None = None,
        run_id: str | None = None,
        server: str,
        headers: dict[str, str] | None,
    ) -> int:
        """Replace (or with None remove) one server's headers at `level` and its scope, keeping the
        other servers' (an OAuth connection's renewed token); returns the new version."""
        key = self.key(level, toolset_id=toolset_id, namespace=namespace, run_id=run_id)
        while True:
            async with self._redis.pipeline(transaction=True) as pipe:
                await pipe.watch(key)
                raw = await pipe.get(key)
                doc: dict[str, Any] = {"servers": {}}
                if raw is not None:
                    try:
                        doc = json.loads(self._cipher.decrypt(raw))
                    except DecryptionError:
                        doc = {"servers": {}}  # unreadable: replaced, as a set would
                if headers is None:
                    doc.setdefault("servers", {}).pop(server, None)
                else:
                    doc.setdefault("servers", {})[server] = {"headers": headers}
                pipe.multi()
                pipe.set(key, self._cipher.encrypt(json.dumps(doc).encode()))
                pipe.incr(self.version_key)
                try:
                    results = await pipe.execute()
                except WatchError:  # a set or another patch meanwhile: apply on top of it
                    continue
            return int(results[1])

    async def delete_run(self, run_id: str) -> int:
        """Drop the run-level credentials of `run_id`; returns the new version."""
        key = self.key("run", run_id=run_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.incr(self.version_key)
            pipe.srem(self._keys.credentials_index, key)  # (the dispatcher runs this too)
            results = await pipe.execute()
        return int(results[1])

    async def rotate(self) -> int:
        """Re-encrypt every stored record with the first configured key (after prepending a new
        key to `TOOLBUS_SECRET_KEY`); returns how many were rewritten. Safe to run twice, and
        while the services run (a record replaced meanwhile is left as written).

        The records are those `index_encrypted` indexed: the credentials documents and the OAuth
        connections, client registrations, pending flows and links (a TTL is kept). It walks the
        indexes (`Keys.credentials_index`, `Keys.credentials_index_expiring`), not `SCAN`: the
        credentials service's Redis user may not list the other services' keys. Records stored
        before the index existed are indexed by `index_existing`, once, with a Redis user allowed
        to `SCAN`."""
        count = 0
        async for member in self._redis.sscan_iter(self._keys.credentials_index, count=500):
            count += await self._rotate_one(text(member), self._keys.credentials_index)
        now = int(time.time() * 1000)
        expiring = await self._redis.zrangebyscore(self._keys.credentials_index_expiring, now, "+inf")
        for member in expiring:
            count += await self._rotate_one(text(member), None)
        return count

    async def _rotate_one(self, key: str, index: str | None) -> int:
        """Re-encrypt the record at `key` unless it changed meanwhile; a record gone is dropped
        from `index` (when given) unless it was written again meanwhile."""
        async with self._redis.pipeline(transaction=True) as pipe:
            await pipe.watch(key)
            raw = await pipe.get(key)
            pipe.multi()
            if raw is None:
                if index is None:
                    return 0
                pipe.srem(index, key)
            else:
                pipe.set(key, self._cipher.rotate(raw), keepttl=True)
            try:
                await pipe.execute()
            except WatchError:  # written (or dropped) meanwhile: what is there is fresh
                return 0
        return 0 if raw is None else 1

    async def index_existing(self) -> int:
        """Index every encrypted record found by `SCAN` (credentials documents, OAuth records)
        for `rotate`; returns how many there are. Only for records stored before the index
        existed (each write indexes its own), run once by an operator whose Redis user may `SCAN`
        (the services' may not)."""
        prefix = self._keys.credentials("", "").removesuffix("::")
        found: list[str] = []
        async for raw in self._redis.scan_iter(match=f"{prefix}:*:*", count=500):
            key = text(raw)
            value = await self._redis.get(key) if key.endswith(":set-version") else b""
            if value is not None and value.isdigit():  # a set's version counter, not a document
                continue
            found.append(key)
        for pattern in (self._keys.oauth_connection("*", "*", "*"), self._keys.oauth_client("*")):
            async for raw in self._redis.scan_iter(match=pattern, count=500):
                found.append(text(raw))
        for start in range(0, len(found), 500):
            await self._redis.sadd(self._keys.credentials_index, *found[start : start + 500])
        pending = 0
        for pattern in (self._keys.oauth_flow("*"), self._keys.oauth_start("*")):
            async for raw in self._redis.scan_iter(match=pattern, count=500):
                ttl = await self._redis.pttl(raw)
                if ttl > 0:
                    async with self._redis.pipeline(transaction=True) as pipe:
                        index_encrypted(pipe, self._keys, text(raw), ttl_ms=ttl)
                        await pipe.execute()
                    pending += 1
        return len(found) + pending

    # ---- reads -----------------------------------------------------------------------------------

    async def resolve(
        self,
        *,
        toolset_id: str,
        namespace: str | None,
        run_id: str | None,
        server: str,
        version: int | None = None,
    ) -> Resolved:
        """The headers for `server` from the most specific level that has an entry for it.

        With `version` (the counter's current value, read by the caller), the answer comes from
        memory with no I/O while the version is unchanged; a new version drops the cache first.
        Without it, Redis is read every time.
        """
        keys = self._level_keys(toolset_id, namespace, run_id)
        if version is None:
            docs = await self._fetch([k for _, k in keys])
            return _pick(server, [(level, docs[k]) for level, k in keys])
        cacheable = True
        if self._cache_version is None or version > self._cache_version:
            self._cache.clear()
            self._cache_version = version
        elif version < self._cache_version:
            cacheable = False  # an older reader: answer it from Redis, keep the newer cache
        found: dict[str, _Doc | None] = {}
        missing: list[str] = []
        for _, k in keys:
            if cacheable and k in self._cache:
                found[k] = self._cache[k]
                self._cache.move_to_end(k)
            else:
                missing.append(k)
        if missing:
            fetched = await self._fetch(missing)
            found.update(fetched)
            # Store only if no newer version arrived while we awaited: what we read is at least as
            # new as `version` (the counter moves in the same transaction as the data).
            if cacheable and self._cache_version == version:
                for k, doc in fetched.items():
                    self._cache[k] = doc
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return _pick(server, [(level, found[k]) for level, k in keys])

    def _level_keys(
        self, toolset_id: str, namespace: str | None, run_id: str | None
    ) -> list[tuple[CredentialLevel, str]]:
        keys: list[tuple[CredentialLevel, str]] = []
        if run_id:
            keys.append(("run", self.key("run", run_id=run_id)))
        if namespace:
            keys.append(("namespace", self.key("namespace", toolset_id=toolset_id, namespace=namespace)))
        keys.append(("toolset", self.key("toolset", toolset_id=toolset_id)))
        return keys

    async def _fetch(self, keys: list[str]) -> dict[str, _Doc | None]:
        # MGET: one round trip. The keys are not hash-tagged together; under Redis Cluster this
        # would need a pipeline instead.
        raws = await self._redis.mget(keys)
        return {
            k: (self._open(k, raw) if raw is not None else None) for k, raw in zip(keys, raws, strict=True)
        }

    def _open(self, key: str, raw: bytes) -> _Doc:
        try:
            data: Any = json.loads(self._cipher.decrypt(raw))
        except DecryptionError:
            # Set under a key no longer (or never) configured here: a key dropped before `rotate`,
            # or another deployment's (each `make up` checkout makes its own dev key).
            log.error(
                "stored credentials cannot be decrypted with any TOOLBUS_SECRET_KEY entry; calls "
                "that need them are parked until they are set again",
                extra={"key": key},
            )
            return _UNREADABLE
        servers: dict[str, Any] = data.get("servers", {})
        return {name: dict(entry["headers"]) for name, entry in servers.items()}


def _pick(server: str, docs: list[tuple[CredentialLevel, _Doc | None]]) -> Resolved:
    for level, doc in docs:
        if doc is _UNREADABLE:  # it may hold this server's entry: never fall through past it
            raise UnreadableCredentials(level)
        if doc is not None and server in doc:
            return Resolved(dict(doc[server]), level)
    return NOTHING
