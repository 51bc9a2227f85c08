"""What TLS costs the dispatcher's hot-path Redis scripts, and whether the pipe still pays off:
EVALSHA of a one-key script through `ScriptPipe` and through redis-py's asyncio client, each over
plain TCP (the baseline) and over TLS with a client certificate, sequentially and with 16 in
flight. Starts its own two Redis servers (plain, TLS-only) on free ports with a throwaway CA.

    uv run python bench/redis_tls.py [--calls 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from toolbus_common.connections import connect_redis, connect_script_pipe
from toolbus_common.settings import Settings
from toolbus_devstack import find_redis_server, free_port, spawn, start_redis_server, stop_process
from toolbus_devstack.tls import make_dev_pki

SCRIPT = "return redis.call('INCR', KEYS[1])"


async def _time(call: Callable[[], Awaitable[Any]], n: int, in_flight: int) -> tuple[float, float]:
    """(p50 µs of one call, calls/s) for `n` calls, `in_flight` at a time."""
    samples: list[float] = []
    gate = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with gate:
            t = time.perf_counter()
            await call()
            samples.append(time.perf_counter() - t)

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    elapsed = time.perf_counter() - start
    return statistics.median(samples) * 1e6, n / elapsed


async def _measure(settings: Settings, label: str, n: int) -> None:
    client = connect_redis(settings)
    pipe = connect_script_pipe(settings, client)
    sha = await client.script_load(SCRIPT)
    key = f"bench:tls:{secrets.token_hex(4)}"
    try:
        for in_flight in (1, 16):
            p_pipe, r_pipe = await _time(lambda: pipe.evalsha(sha, [key], []), n, in_flight)
            p_py, r_py = await _time(lambda: client.evalsha(sha, 1, key), n, in_flight)  # type: ignore[misc]
            print(
                f"{label:<6} in flight {in_flight:>2}: pipe p50 {p_pipe:7.0f} µs {r_pipe:8.0f}/s   "
                f"redis-py p50 {p_py:7.0f} µs {r_py:8.0f}/s   pipe/redis-py throughput x{r_pipe / r_py:.2f}"
            )
    finally:
        await client.delete(key)
        await pipe.aclose()
        await client.aclose()


async def main(n: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="toolbus-bench-tls-"))
    pki = make_dev_pki(tmp / "pki")
    plain = start_redis_server(free_port(), tmp / "plain", tmp / "plain.log")
    binary = find_redis_server()
    assert binary is not None
    port, password = free_port(), "p" + secrets.token_hex(16)
    conf = tmp / "tls.conf"
    conf.write_text(
        f"bind 127.0.0.1\nport 0\ntls-port {port}\ntls-cert-file {pki.server_cert}\n"
        f"tls-key-file {pki.server_key}\ntls-ca-cert-file {pki.ca}\ntls-auth-clients yes\n"
        f'requirepass {password}\ndir {tmp}\nsave ""\n'
    )
    tls = spawn([binary, str(conf)], tmp / "tls.log", env=None, detach=False)
    try:
        await asyncio.sleep(0.5)
        await _measure(Settings(redis_url=plain.url), "plain", n)
        tls_settings = Settings(
            redis_url=f"rediss://127.0.0.1:{port}/0",
            redis_password=password,  # type: ignore[arg-type]
            redis_tls_ca_file=str(pki.ca),
            redis_tls_cert_file=str(pki.client_cert),
            redis_tls_key_file=str(pki.client_key),
        )
        await _measure(tls_settings, "tls", n)
    finally:
        plain.stop()
        stop_process(tls)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    asyncio.run(main(parser.parse_args().calls))
