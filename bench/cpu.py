"""The dispatcher's CPU per `calls.invoke` (user + system, from /proc, over `--calls` calls with 16
in flight after a warm-up), on one or more dispatcher processes (summed), `--repeat` times; with
`--strace`, also the system calls per call (`strace -c` attached while the same number of calls
run: counts are repeatable on a loaded machine where times are not).

    uv run python bench/cpu.py [--calls 3000] [--dispatchers 1] [--repeat 1] [--strace]

strace slows the traced process several fold: read its counts, not the rates. Needs ptrace.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import commit, cpu_seconds, in_flight
from bench.stack import BenchStack


def sys_seconds(pid: int) -> float:
    """System CPU of a process so far, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[12]) / os.sysconf("SC_CLK_TCK")


def parse(text: str) -> dict[str, int]:
    """{syscall: calls} from `strace -c` output."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", line)
        if m and m.group(2) != "total":
            counts[m.group(2)] = counts.get(m.group(2), 0) + int(m.group(1))
    return counts


async def main(calls: int, dispatchers: int, repeat: int, trace: bool) -> None:
    strace = shutil.which("strace")
    async with BenchStack(("registry", "dispatcher")) as stack:
        pids = [stack.services["dispatcher"].proc.pid]
        for _ in range(dispatchers - 1):
            pids.append((await stack.add_dispatcher()).proc.pid)
        await in_flight(stack.invoke, 1000)  # warm
        print(f"commit {commit()['commit']}")
        for _ in range(repeat):
            before = sum(cpu_seconds(p) for p in pids)
            before_sys = sum(sys_seconds(p) for p in pids)
            _, rate, _ = await in_flight(stack.invoke, calls)
            cpu = (sum(cpu_seconds(p) for p in pids) - before) / calls
            kernel = (sum(sys_seconds(p) for p in pids) - before_sys) / calls
            print(
                f"{calls} calls.invoke, 16 in flight, {dispatchers} dispatcher(s): {rate:.0f} calls/s,"
                f" dispatcher CPU {cpu * 1e6:.0f} µs per call ({kernel * 1e6:.0f} µs of it in the kernel)"
            )
        if not trace:
            return
        if strace is None:
            print("strace not found: no system call counts")
            return
        outs = []
        procs = []
        for pid in pids:
            out = Path(tempfile.mkstemp(prefix="strace-")[1])
            outs.append(out)
            procs.append(
                await asyncio.create_subprocess_exec(
                    strace,
                    "-c",
                    "-f",
                    "-p",
                    str(pid),
                    "-o",
                    str(out),
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
            )
        await asyncio.sleep(1.0)
        await in_flight(stack.invoke, calls)
        for proc in procs:
            proc.send_signal(2)
            await proc.wait()
        total: dict[str, int] = {}
        for out in outs:
            for name, n in parse(out.read_text()).items():
                total[name] = total.get(name, 0) + n
        print("system calls per call (all dispatchers together):")
        for name, n in sorted(total.items(), key=lambda kv: -kv[1]):
            if n / calls >= 0.01:
                print(f"  {name:<16} {n / calls:6.2f}")
        print(f"  {'total':<16} {sum(total.values()) / calls:6.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--dispatchers", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--strace", action="store_true")
    a = ap.parse_args()
    asyncio.run(main(a.calls, a.dispatchers, a.repeat, a.strace))
