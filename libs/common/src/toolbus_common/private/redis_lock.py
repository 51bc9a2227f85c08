"""Whether a redis-py `Lock` holds a token, and forgetting it (redis 8.1.0).

redis-py keeps the token of an acquired lock in `Lock.local.token` (a thread-local or a plain
namespace) and has no public way to ask for it: the event relay asks whether it believes it holds
the lock (renew it, or take it) and forgets a token Redis said is no longer its."""

from __future__ import annotations

from redis.asyncio.lock import Lock


def has_token(lock: Lock) -> bool:
    """Whether this lock object believes it holds the lock (an acquire succeeded since)."""
    return lock.local.token is not None


def forget_token(lock: Lock) -> None:
    """Forget the token (Redis said it is no longer this lock's: it lapsed and was taken)."""
    lock.local.token = None
