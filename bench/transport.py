"""What FastStream costs on a request/reply: the same echo served by a raw nats-py subscription and
by FastStream subscribers, side by side in one run, p50/p99.

The servers run in one subprocess (so serving does not share the bench's GIL), each on its own
subject; the client is a bare nats-py connection in this process; the order of the paths is
rotated every round so drift on a busy machine hits them alike.

- raw nats-py: `nc.subscribe(cb=...)`, `msg.respond(body)` (the baseline);
- FastStream leanest: `NatsBroker(apply_types=False, logger=None)`, a core subscriber whose
  handler returns the body (FastStream publishes the reply);
- FastStream default: `NatsBroker()` with its logging and fast-depends on, a typed handler;
- toolbus bus: `toolbus_common.bus.Bus` as the services use it (contract parse, envelope, reply
  guard, metrics), on a FastStream-served route and on a `fast` one (raw nats-py, as
  `calls.start` and `calls.invoke` are served).

    uv run python bench/transport.py [--requests 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from toolbus_contracts import RunOpenReply, RunOpenRequest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NATS_URL = os.environ.get("TOOLBUS_NATS_URL", "nats://127.0.0.1:4222")
PATHS = (
    "raw nats-py (baseline)",
    "FastStream leanest",
    "FastStream default",
    "toolbus bus, FastStream route",
    "toolbus bus, fast (raw) route",
)
BODY = b'{"toolsetId":"ts_%s","namespace":"user-42"}' % (b"0" * 64)


async def serve(prefix: str) -> None:
    """The servers: one per path, on `<prefix>.<n>`; prints `ready` and serves until stdin closes."""
    import logging

    import nats
    from faststream.nats import NatsBroker
    from pydantic import BaseModel
    from toolbus_common.settings import Settings

    logging.basicConfig(level=logging.WARNING)
    nc = await nats.connect(NATS_URL)

    async def raw(msg: Any) -> None:
        await msg.respond(msg.data)

    await nc.subscribe(f"{prefix}.0", cb=raw)

    lean = NatsBroker(NATS_URL, apply_types=False, logger=None)

    @lean.subscriber(f"{prefix}.1")
    async def lean_echo(body: bytes) -> bytes:
        return body

    default = NatsBroker(NATS_URL)

    class Body(BaseModel):
        toolsetId: str
        namespace: str

    @default.subscriber(f"{prefix}.2")
    async def default_echo(body: Body) -> Body:
        return body

    await lean.start()
    await default.start()
    started: list[Any] = []
    try:
        from toolbus_common.bus import Bus, Routes

        routes: Routes[None] = Routes("bench")

        @routes.request(lambda s: f"{prefix}.3")
        async def handle(_: None, req: RunOpenRequest) -> RunOpenReply:
            return RunOpenReply(run_id="run_x")

        @routes.request(lambda s: f"{prefix}.4", fast=True)
        async def handle_fast(_: None, req: RunOpenRequest) -> RunOpenReply:
            return RunOpenReply(run_id="run_x")

        bus = Bus(Settings(nats_url=NATS_URL), name="bench", queue="bench")
        bus.include(routes, None)
        await bus.start()
        started.append(bus)
    except ImportError:
        pass
    await nc.flush()
    print("ready", len(started), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for bus in started:
        await bus.drain()
        await bus.close()
    await lean.stop()
    await default.stop()
    await nc.close()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def main(requests: int, rounds: int) -> None:
    import secrets

    import nats

    prefix = f"tbbench{secrets.token_hex(4)}.echo"
    server = subprocess.Popen(  # noqa: ASYNC220 - started once, before anything is timed
        [sys.executable, __file__, "--serve", prefix],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert server.stdout is not None
    assert server.stdin is not None
    line: list[str] = []
    for _ in range(50):  # FastStream's default logger prints its start-up lines first
        line = server.stdout.readline().split()
        if not line or line[0] == "ready":
            break
    if not line or line[0] != "ready":
        server.kill()
        raise SystemExit("the echo servers did not start")
    import threading

    stdout = server.stdout
    threading.Thread(target=lambda: [None for _ in stdout], daemon=True).start()  # keep the pipe read
    paths = PATHS if line[1] == "1" else PATHS[:3]
    nc = await nats.connect(NATS_URL)
    try:
        for i in range(len(paths)):  # warm-up
            for _ in range(300):
                await nc.request(f"{prefix}.{i}", BODY, timeout=5)
        results: dict[int, list[float]] = {i: [] for i in range(len(paths))}
        for r in range(rounds):
            order = list(range(len(paths)))
            order = order[r % len(order) :] + order[: r % len(order)]
            for i in order:
                subject = f"{prefix}.{i}"
                for _ in range(requests):
                    t = time.perf_counter()
                    await nc.request(subject, BODY, timeout=5)
                    results[i].append(time.perf_counter() - t)
        base = percentile(results[0], 0.5)
        print(f"\n{requests} sequential request/replies x {rounds} rounds per path; µs")
        print(f"{'server side':<34}{'p50':>8}{'p99':>8}{'p50 over raw':>14}")
        for i, name in enumerate(paths):
            p50, p99 = percentile(results[i], 0.5), percentile(results[i], 0.99)
            print(f"{name:<34}{p50 * 1e6:>8.0f}{p99 * 1e6:>8.0f}{(p50 - base) * 1e6:>+14.0f}")
    finally:
        await nc.close()
        server.stdin.close()
        server.wait(15)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        import uvloop  # the services run on uvloop

        uvloop.run(serve(args.serve))
    else:
        asyncio.run(main(args.requests, args.rounds))
