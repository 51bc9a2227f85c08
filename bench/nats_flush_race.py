"""nats-py's flush() vs a subscription made just before it (docs/design.md, "Written here").

    uv run python bench/nats_flush_race.py plain     # subscribe(); nc.flush()
    uv run python bench/nats_flush_race.py fixed     # subscribe(); flush(nc) (pending forced out first)

Starts its own nats-server on a free port; per round: subscribe on connection A, flush, request on
connection B; prints how many requests found no responder.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import nats
from nats.aio.msg import Msg
from toolbus_common.connections import flush
from toolbus_devstack import free_port, start_nats_server

ROUNDS = 2000


async def main(fixed: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = start_nats_server(free_port(), Path(tmp) / "js", Path(tmp) / "nats.log")
        try:
            a = await nats.connect(server.url)
            b = await nats.connect(server.url)

            async def respond(msg: Msg) -> None:
                await msg.respond(b"x")

            missed = 0
            for i in range(ROUNDS):
                sub = await a.subscribe(f"race.{i}", cb=respond)
                await (flush(a) if fixed else a.flush())
                try:
                    await b.request(f"race.{i}", b"", timeout=2)
                except nats.errors.NoRespondersError:
                    missed += 1
                await sub.unsubscribe()
            print(f"{'flush(nc)' if fixed else 'nc.flush()'}: no responders {missed} / {ROUNDS}")
            await a.close()
            await b.close()
        finally:
            server.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] == ["fixed"]))
