"""Requests failed after a Redis restart (issue 38, item 1): a whole toolbus of processes on its
own NATS and Redis (the fault suite's stack), a steady load of reads and writes through every
service that uses Redis, Redis stopped for `--down` seconds and started again, then `--per-kind`
requests of each kind sent as soon as every `/readyz` is 200. Prints, per kind, the replies
`unavailable` after the restart (the figure to bring to 0), those during the load, commands
applied twice, and what the services logged meanwhile (outage warnings, recovery lines,
tracebacks).

    uv run python bench/redis_restart.py [--down 5] [--per-kind 300]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.system.faults.redis_outage import KINDS, restart_under_load
from tests.system.faults.stack import open_stack


async def main(downs: list[float], per_kind: int) -> None:
    stack = await open_stack(dispatchers=1)
    try:
        toolset = await stack.toolset()
        for down in downs:
            out = await restart_under_load(stack, toolset, down=down, per_kind=per_kind)
            print(
                f"\nRedis down {down:g} s; every /readyz 200 {out.ready_seconds:.1f} s after it was started again"
            )
            print(
                f"  {'kind':<22} {'unavailable after':>18} {'other errors after':>19} {'unavailable during':>19}"
            )
            for kind in KINDS:
                after = out.after.codes[kind]
                other = sum(n for code, n in after.items() if code not in ("ok", "unavailable"))
                print(
                    f"  {kind:<22} {after['unavailable']:>12}/{sum(after.values()):<5} {other:>19}"
                    f" {out.during.unavailable(kind):>19}"
                )
            print(f"  applied twice (an at_most_once input seen twice by the tool): {out.applied_twice}")
            logs = out.logs
            print(f"  log lines per service: {logs.lines}")
            print(f"  '{'Redis unreachable'}' warnings: {logs.unreachable}; recovery lines: {logs.back}")
            print(f"  unavailable replies the recovery lines report: {logs.reported_unavailable}")
            print(f"  tracebacks: {logs.tracebacks} ({logs.traceback_lines} lines)")
            for line in logs.sample:
                print(f"    e.g. {line[:300]}")
    finally:
        await stack.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--down", type=float, action="append", help="seconds down (repeatable; default 5)")
    parser.add_argument("--per-kind", type=int, default=300)
    args = parser.parse_args()
    asyncio.run(main(args.down or [5.0], args.per_kind))
