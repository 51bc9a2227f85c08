"""Redis ACL users of a toolbus deployment: one per service that uses Redis, each allowed only
the commands that service sends (its Lua scripts' commands included: Redis checks those against
the caller's ACL too) on only its own keys, read-only where it only reads (the credentials
service on the dispatcher's run keys). No user may `SCAN` or `KEYS` (key patterns do not limit
what `SCAN` lists), flush anything (`FLUSHALL`, `FLUSHDB`, `SCRIPT FLUSH`, `FUNCTION *`), or
reach `CONFIG`, `DEBUG` or pub/sub channels.

`render_acl(prefix, passwords)` writes a Redis ACL file (`aclfile`) with SHA-256 password
hashes, never the passwords (`make up` with `TOOLBUS_SECURE=1`); deploy/compose/compose.yaml
writes the same rules, checked against `acl_rules()` by tests/deploy.

The registry does not use Redis. Harnesses, workers and approvers never connect to Redis.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

CONNECTION = ("ping", "select")
"""What a client sends besides its commands: health checks and the database of the URL. AUTH
and HELLO need no permission; `CLIENT SETINFO` (Redis 7.2+) is not sent (connect_redis)."""

TRANSACTIONS = ("multi", "exec", "discard", "watch", "unwatch")

SCRIPTS = ("evalsha", "script|load", "script|exists")
"""Lua scripts by SHA (redis-py loads one that Redis lacks, and checks before a pipeline runs
one); `SCRIPT FLUSH` and `SCRIPT KILL` are not here, nor `EVAL` (nothing sends a script's text
to run), nor any `FUNCTION` or `FCALL`."""


@dataclass(frozen=True)
class RedisUser:
    name: str
    purpose: str
    key_patterns: tuple[str, ...]
    """Keys it may read and write."""
    read_patterns: tuple[str, ...]
    """Keys it may only read (`%R~`, Redis 7.0 and later)."""
    commands: tuple[str, ...]
    """Data commands it may send (lower case; `cmd|sub` for one subcommand), beyond
    `CONNECTION`, `TRANSACTIONS` and `SCRIPTS`."""

    def all_commands(self) -> tuple[str, ...]:
        return (*CONNECTION, *TRANSACTIONS, *SCRIPTS, *self.commands)


def redis_users(prefix: str = "toolbus") -> list[RedisUser]:
    k = prefix
    return [
        RedisUser(
            "dispatcher",
            "runs, calls, slots, leases, the event outbox; reads credentials, drops a closed run's",
            (
                f"{k}:run:*",
                f"{k}:call:*",
                f"{k}:calls:*",
                f"{k}:replies:*",
                f"{k}:cred:run:*",
                f"{k}:cred:version",
                f"{k}:cred:index",
            ),
            (f"{k}:cred:*",),
            # Its Lua scripts, the store's reads, the event relay (XREAD/XDEL/XLEN), the relay's
            # lock (SET NX PX; GET/PTTL/PEXPIRE/DEL in redis-py's scripts) and the credential
            # store (MGET, GET of the version; DEL/INCRBY/SREM of a closed run's credentials: redis-py
            # sends INCRBY for `incr`).
            (
                "del", "expire", "pexpire", "pttl", "get", "mget", "set", "incrby",
                "hget", "hmget", "hgetall", "hset", "hincrby",
                "lrange", "rpush",
                "sadd", "srem", "smembers",
                "zadd", "zcard", "zrange", "zrangebyscore", "zrem",
                "xadd", "xread", "xdel", "xlen",
                "time",
            ),
        ),
        RedisUser(
            "credentials",
            "credential levels, OAuth connections, parked calls, webhooks; checks that a run exists",
            (
                f"{k}:cred:*",
                f"{k}:parked:*",
                f"{k}:parked-*",
                f"{k}:webhooks:*",
                f"{k}:webhook:*",
                f"{k}:oauth:*",
            ),
            (f"{k}:run:*",),
            (
                "get", "mget", "set", "del", "incr", "incrby", "exists", "getdel",
                "hget", "hmget", "hgetall", "hset", "hsetnx", "hdel", "hexists", "hvals",
                "sadd", "srem", "smembers", "sismember", "sscan",
                "zadd", "zcard", "zrange", "zrangebyscore", "zrem", "zremrangebyscore", "zscore",
                # the outbox relay and its lock (as the approval service's)
                "pexpire", "xadd", "xread", "xdel", "xlen",
            ),
        ),
        RedisUser(
            "approval",
            "pending approvals, their outbox and webhooks",
            (f"{k}:{{approvals}}:*",),
            (),
            # The outbox relay (XREAD/XDEL/XLEN) and its lock (SET NX PX; GET/PEXPIRE/DEL in
            # redis-py's scripts) besides the approvals' own scripts and reads.
            (
                "exists", "expire", "pexpire", "get", "mget", "set", "del",
                "hget", "hmget", "hgetall", "hset", "hexists",
                "zadd", "zcard", "zrange", "zrangebyscore", "zrevrangebyscore", "zrem",
                "zremrangebyscore",
                "xadd", "xread", "xdel", "xlen",
            ),
        ),
        RedisUser(
            "gateway",
            "bearer tokens of the MCP endpoint (hashed)",
            (f"{k}:gw:*",),
            (),
            ("get", "set", "del", "hget", "hgetall", "hset", "hdel"),
        ),
    ]  # fmt: skip


def acl_rules(user: RedisUser) -> str:
    """The ACL rules of `user` after its name and password: no channels, its keys, its commands."""
    keys = " ".join([*(f"~{p}" for p in user.key_patterns), *(f"%R~{p}" for p in user.read_patterns)])
    commands = " ".join(f"+{c}" for c in user.all_commands())
    return f"resetchannels resetkeys {keys} -@all {commands}"


def merged_users(prefixes: Sequence[str]) -> list[RedisUser]:
    """`redis_users` of several key prefixes at once (one deployment's users serving each: the
    tests' secured stacks), the patterns of every prefix on each user."""
    by_name: dict[str, RedisUser] = {}
    for prefix in prefixes:
        for user in redis_users(prefix):
            seen = by_name.get(user.name)
            if seen is None:
                by_name[user.name] = user
                continue
            by_name[user.name] = RedisUser(
                user.name,
                user.purpose,
                (*seen.key_patterns, *user.key_patterns),
                (*seen.read_patterns, *user.read_patterns),
                user.commands,
            )
    return list(by_name.values())


def render_acl(
    prefix: str | Sequence[str], passwords: dict[str, str], *, admin_password: str | None = None
) -> str:
    """Redis ACL file text for one key prefix (or several). `admin_password` keeps the `default`
    user on with every right (for operators and probes); without it `default` is off."""
    prefixes = [prefix] if isinstance(prefix, str) else list(prefix)
    lines: list[str] = []  # an ACL file has no comments
    if admin_password is None:
        lines.append("user default off")
    else:
        lines.append(f"user default on #{_sha256(admin_password)} ~* &* +@all")
    for user in merged_users(prefixes):
        lines.append(f"user {user.name} on #{_sha256(passwords[user.name])} {acl_rules(user)}")
    return "\n".join(lines) + "\n"


def _sha256(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()
