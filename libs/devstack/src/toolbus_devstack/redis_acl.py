"""Redis ACL users of a toolbus deployment: one per service that uses Redis, each limited to its
own keys, so that the encrypted credentials (`<K>:cred:*`) are readable by the credentials
service and the dispatcher only. `render_acl(prefix, passwords)` writes a Redis ACL file
(`aclfile`) with SHA-256 password hashes, never the passwords (`make up` with `TOOLBUS_SECURE=1`);
deploy/compose/compose.yaml writes the same users, checked against `redis_users()` by tests/deploy.

The registry does not use Redis. Harnesses, workers and approvers never connect to Redis.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class RedisUser:
    name: str
    purpose: str
    key_patterns: tuple[str, ...]


def redis_users(prefix: str = "toolbus") -> list[RedisUser]:
    k = prefix
    return [
        RedisUser("dispatcher", "runs, calls, slots, leases, parked calls; reads credentials", (f"{k}:*",)),
        RedisUser(
            "credentials",
            "credential levels, OAuth connections, parked calls, webhooks; checks that a run exists",
            (
                f"{k}:cred:*",
                f"{k}:parked:*",
                f"{k}:parked-*",
                f"{k}:run:*",
                f"{k}:webhooks:*",
                f"{k}:webhook:*",
                f"{k}:oauth:*",
            ),
        ),
        RedisUser(
            "approval",
            "pending approvals, their outbox and webhooks",
            (f"{k}:{{approvals}}:*", f"{k}:webhooks:*", f"{k}:webhook:*"),
        ),
    ]


# Everything but the commands Redis itself marks dangerous (FLUSHALL, KEYS, CONFIG, DEBUG, ...).
COMMANDS = "+@all -@dangerous"


def render_acl(prefix: str, passwords: dict[str, str], *, admin_password: str | None = None) -> str:
    """Redis ACL file text. `admin_password` keeps the `default` user on with every right (for
    operators and probes); without it `default` is off."""
    lines: list[str] = []  # an ACL file has no comments
    if admin_password is None:
        lines.append("user default off")
    else:
        lines.append(f"user default on #{_sha256(admin_password)} ~* &* +@all")
    for user in redis_users(prefix):
        patterns = " ".join(f"~{p}" for p in user.key_patterns)
        lines.append(
            f"user {user.name} on #{_sha256(passwords[user.name])} resetchannels {patterns} {COMMANDS}"
        )
    return "\n".join(lines) + "\n"


def _sha256(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()
