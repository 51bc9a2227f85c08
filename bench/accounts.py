"""What the secured configuration's client accounts cost on a request: the same echo answered by
a service user, asked once from inside the services' account and once from the `harness`
account through its service import (deploy/nats/toolbus-auth.conf as shipped), side by side in
alternated rounds on one nats-server started here; p50/p99 sequential and 16 in flight.

    uv run python bench/accounts.py [--requests 3000] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import percentile

BODY = b'{"toolsetId":"ts_%s","credentials":{"servers":{}}}' % (b"0" * 64)


async def measure(requests: int, rounds: int, binary: str | None) -> dict[str, dict[str, list[float]]]:
    import nats
    from toolbus_devstack import find_nats_server, free_port, start_nats_server
    from toolbus_devstack.nats_conf import client_env, dev_credentials, render_auth_conf, server_env
    from toolbus_nats_connect import NatsAuth

    conf_dir = Path(tempfile.mkdtemp(prefix="tb-accounts-"))
    (conf_dir / "nats-server.conf").write_text((ROOT / "deploy/nats/nats-server.conf").read_text())
    (conf_dir / "toolbus-auth.conf").write_text(render_auth_conf("toolbus"))
    passwords = dev_credentials()
    server = start_nats_server(
        free_port(),
        conf_dir / "store",
        conf_dir / "nats.log",
        binary=binary or find_nats_server(at_least=(2, 10, 0)),
        config=conf_dir / "nats-server.conf",
        env=server_env(passwords),
    )

    async def connect(role: str) -> Any:
        env = {"TOOLBUS_NATS_URL": server.url, **client_env(role, passwords[role])}
        return await nats.connect(**NatsAuth.from_env(env).connect_options())

    try:
        responder = await connect("credentials")

        async def echo(msg: Any) -> None:
            await msg.respond(msg.data)

        await responder.subscribe("toolbus.toolsets.credentials.set", queue="q", cb=echo)
        await responder.flush()
        askers = {
            "inside the services' account (registry user)": await connect("registry"),
            "harness account, through its import": await connect("harness"),
        }
        out: dict[str, dict[str, list[float]]] = {k: {"seq": [], "par": []} for k in askers}
        for r in range(rounds):
            order = list(askers.items())
            if r % 2:
                order.reverse()
            for name, nc in order:
                for _ in range(200):  # warm
                    await nc.request("toolbus.toolsets.credentials.set", BODY, timeout=5)
                for _ in range(requests):
                    t = time.perf_counter()
                    await nc.request("toolbus.toolsets.credentials.set", BODY, timeout=5)
                    out[name]["seq"].append((time.perf_counter() - t) * 1000)

                async def worker(nc: Any = nc, name: str = name) -> None:
                    for _ in range(requests // 16):
                        t = time.perf_counter()
                        await nc.request("toolbus.toolsets.credentials.set", BODY, timeout=5)
                        out[name]["par"].append((time.perf_counter() - t) * 1000)

                await asyncio.gather(*(worker() for _ in range(16)))
        for nc in (*askers.values(), responder):
            await nc.close()
        return out
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--nats-server", default=None, help="binary (default: a 2.10+ one)")
    args = parser.parse_args()
    out = asyncio.run(measure(args.requests, args.rounds, args.nats_server))
    names = list(out)
    base = out[names[0]]
    print(f"{'request/reply':<48} {'seq p50':>9} {'seq p99':>9} {'16 p50':>9} {'16 p99':>9}")
    for name in names:
        row = out[name]
        cells = [percentile(row[k], p) for k in ("seq", "par") for p in (0.5, 0.99)]
        print(f"{name:<48} " + " ".join(f"{c:>7.3f}ms" for c in cells))
    added = percentile(out[names[1]]["seq"], 0.5) - percentile(base["seq"], 0.5)
    print(f"\nimport adds {added * 1000:+.0f} µs to a sequential request's p50 (baseline: same account)")


if __name__ == "__main__":
    main()
