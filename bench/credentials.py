"""What credential resolution adds to a call, against a resolution-free baseline in the same run.

The dispatcher reads the credentials version in the Lua round trip it makes per call anyway and
passes it to `CredentialStore.resolve`. Figures (p50, p99):
- baseline: that round trip alone (a Redis GET of the version counter);
- cached: the round trip + resolve with the version unchanged (no I/O: the added cost);
- after a set: the round trip + resolve right after a set (one MGET + decrypt);
- resolve only, cached: the in-process cost by itself.

Run: `uv run python bench/credentials.py` (Redis from TOOLBUS_REDIS_URL, default local).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import time
from pathlib import Path

from cryptography.fernet import Fernet
from redis.asyncio import Redis
from toolbus_common.credential_store import CredentialStore
from toolbus_common.keys import Keys
from toolbus_common.secrets import Cipher
from toolbus_contracts.credentials import Credentials

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Figure, print_table

SECTION = "credential resolution"

N = 3000
TS = "ts_" + "b" * 64


def pct(samples: list[float], q: float) -> float:
    return sorted(samples)[int(q * (len(samples) - 1))] * 1e6


async def measure(n: int = N) -> list[Figure]:
    """Resolution figures (p50, µs) beside the version round trip alone."""
    N = n  # noqa: N806 - the module default, overridden per run
    redis: Redis[bytes] = Redis.from_url(os.environ.get("TOOLBUS_REDIS_URL", "redis://127.0.0.1:6379/0"))
    keys = Keys(f"bench{secrets.token_hex(4)}")
    store = CredentialStore(redis, keys, Cipher(Fernet.generate_key().decode()))
    creds = Credentials.model_validate(
        {"servers": {"github": {"headers": {"Authorization": "Bearer x" * 4}}}}
    )
    await store.set("toolset", toolset_id=TS, credentials=creds)
    await store.set("namespace", toolset_id=TS, namespace="u", credentials=creds)
    args = {"toolset_id": TS, "namespace": "u", "run_id": "r1", "server": "github"}
    try:
        base, cached, after, only = [], [], [], []
        for _ in range(300):  # warm up
            await redis.get(store.version_key)
        version = await store.version()
        await store.resolve(**args, version=version)
        for _ in range(N):
            t = time.perf_counter()
            await redis.get(store.version_key)
            base.append(time.perf_counter() - t)

            t = time.perf_counter()
            v = int(await redis.get(store.version_key) or 0)
            await store.resolve(**args, version=v)
            cached.append(time.perf_counter() - t)

            t = time.perf_counter()
            await store.resolve(**args, version=v)
            only.append(time.perf_counter() - t)
        for _ in range(max(1, N // 3)):
            await store.set("run", toolset_id=TS, run_id="r1", credentials=creds)
            t = time.perf_counter()
            v = int(await redis.get(store.version_key) or 0)
            await store.resolve(**args, version=v)
            after.append(time.perf_counter() - t)
        b50, b99 = pct(base, 0.5), pct(base, 0.99)
        return [
            Figure(
                SECTION,
                "version GET + resolve, cached: p50",
                pct(cached, 0.5),
                "µs",
                "version GET only p50",
                b50,
            ),
            Figure(
                SECTION,
                "version GET + resolve, cached: p99",
                pct(cached, 0.99),
                "µs",
                "version GET only p99",
                b99,
            ),
            Figure(
                SECTION,
                "version GET + resolve after a set: p50",
                pct(after, 0.5),
                "µs",
                "version GET only p50",
                b50,
            ),
            Figure(
                SECTION,
                "version GET + resolve after a set: p99",
                pct(after, 0.99),
                "µs",
                "version GET only p99",
                b99,
            ),
            Figure(SECTION, "resolve only, cached: p50", pct(only, 0.5), "µs", "version GET only p50", b50),
        ]
    finally:
        found = [k async for k in redis.scan_iter(match=f"{keys.prefix}:*")]
        if found:
            await redis.delete(*found)
        await redis.aclose()  # type: ignore[attr-defined]


async def main() -> None:
    print_table(await measure(), f"credential resolution, {N} samples")


if __name__ == "__main__":
    asyncio.run(main())
