"""Where the dispatcher's time goes per call: py-spy samples the dispatcher process (a real
`python -m toolbus_dispatcher` on a `BenchStack`) while `calls.invoke` of the echo tool runs with 16
in flight, and this prints the top functions by own time and by inclusive time, as a share of
the samples, beside the dispatcher's CPU per call (from /proc) in the same run.

    uv run python bench/profile.py [--calls 6000] [--rate 250] [--top 30] [--raw out.txt]

py-spy (a dev dependency) must be allowed to read the process's memory (root, or ptrace_scope 0).
Idle samples (the event loop waiting in epoll) are left out: the shares are of CPU-busy samples.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import commit, cpu_seconds, in_flight
from bench.stack import BenchStack


def frame_name(frame: str) -> str:
    """`func (path/to/module.py:line)` with the path cut to the package that matters."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    for marker in ("site-packages/", "/src/", "python3.11/"):
        if marker in where:
            where = where.split(marker, 1)[1]
            break
    return f"{name} ({where})"


def summarize(raw: str, top: int) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """(samples, top lines by own time, top functions by inclusive time) from py-spy's raw output."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [frame_name(f) for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        samples += count
        own[frames[-1]] += count
        for f in {re.sub(r":\d+\)$", ")", f) for f in frames}:  # a function counts once per sample
            total[f] += count
    return samples, own.most_common(top), total.most_common(top)


async def main(calls: int, rate: int, top: int, raw_path: str | None, native: bool) -> None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = Path(raw_path) if raw_path else Path(tempfile.mkdtemp(prefix="profile-")) / "raw.txt"
    async with BenchStack(("registry", "dispatcher")) as stack:
        pid = stack.services["dispatcher"].proc.pid
        await in_flight(stack.invoke, 1000)  # warm
        spy_proc = await asyncio.create_subprocess_exec(
            spy, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw", "--output", str(out),
            *(["--native"] if native else ["--nonblocking"]),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        await asyncio.sleep(1.0)  # py-spy attached
        before = cpu_seconds(pid)
        _, rate_got, _ = await in_flight(stack.invoke, calls)
        cpu = (cpu_seconds(pid) - before) / calls
        if spy_proc.returncode is None:
            spy_proc.send_signal(2)  # SIGINT: py-spy writes its file and exits
        _, err = await spy_proc.communicate()
    if not out.exists():
        raise SystemExit(f"py-spy wrote nothing: {err.decode()[-800:]}")
    samples, own, total = summarize(out.read_text(), top)
    info = commit()
    print(f"commit {info['commit']}{' (dirty)' if info['dirty'] else ''}")
    print(
        f"{calls} calls.invoke of echo.echo, 16 in flight, 1 dispatcher: {rate_got:,.0f} calls/s, "
        f"dispatcher CPU {cpu * 1e3:.3f} ms per call; py-spy {rate} Hz, {samples} busy samples (raw: {out})"
    )
    for title, rows in (
        ("own time (the frame on top of the stack)", own),
        ("inclusive time, by function", total),
    ):
        print(f"\ntop {top} by {title}: share of busy samples, and ms per call at the CPU above")
        for name, count in rows:
            share = count / samples
            print(f"{share * 100:6.1f}%  {share * cpu * 1e3:6.3f} ms  {name}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=6000)
    parser.add_argument("--rate", type=int, default=250)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--raw", metavar="PATH", help="keep py-spy's raw stacks here")
    parser.add_argument("--native", action="store_true", help="C frames too (uvloop, hiredis, orjson, ...)")
    args = parser.parse_args()
    import uvloop

    uvloop.run(main(args.calls, args.rate, args.top, args.raw, args.native))
