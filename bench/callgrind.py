"""The dispatcher's instructions per call, counted by valgrind's callgrind: repeatable where times
on a loaded machine are not. The dispatcher runs under `valgrind --tool=callgrind` with
instrumentation off; after a warm-up it is switched on for `--calls` `calls.invoke` of the echo tool
with 16 in flight, then dumped. Prints instructions per call and the top functions by inclusive and
own instructions (`callgrind_annotate`).

    uv run python bench/callgrind.py [--calls 400] [--top 25]
    uv run python bench/callgrind.py --before ../other-checkout [--rounds 2]   # before/after

`--before` runs the dispatcher of another checkout (its sources first on PYTHONPATH) and this
one's alternately, in one run, and prints both beside each other.

Under valgrind the dispatcher runs ~30-50x slower; the counts are what to read.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import commit, in_flight
from bench.stack import BenchStack


def total_ir(dump: Path) -> int:
    totals = [ln for ln in dump.read_text(errors="replace").splitlines() if ln.startswith("totals:")]
    if totals and int(totals[-1].split()[1]):
        return int(totals[-1].split()[1])
    res = subprocess.run(["callgrind_annotate", str(dump)], capture_output=True, text=True, check=False)
    for line in res.stdout.splitlines():
        if "PROGRAM TOTALS" in line:
            return int(line.split()[0].replace(",", ""))
    raise SystemExit(f"no totals in {dump}")


async def measure(calls: int, pythonpath: str = "") -> Path:
    """One dispatcher under callgrind, `calls` invokes counted; the dump. With `pythonpath`, the
    dispatcher imports its code from there first (another commit's sources)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind not found")
    work = Path(tempfile.mkdtemp(prefix="callgrind-"))
    out = work / "callgrind.out"
    wrapper = work / "python"
    env = f"PYTHONPATH={pythonpath} " if pythonpath else ""
    wrapper.write_text(
        "#!/bin/sh\n"
        f"{env}exec {valgrind} --tool=callgrind --instr-atstart=no --callgrind-out-file={out}.%p "
        f'{sys.executable} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    async with BenchStack(
        ("registry", "dispatcher"), python={"dispatcher": str(wrapper)}, ready=600
    ) as stack:
        pid = stack.services["dispatcher"].proc.pid
        await in_flight(stack.invoke, 200)  # warm: imports, connections, caches
        subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)  # noqa: ASYNC221
        subprocess.run(["callgrind_control", "-i", "on", str(pid)], check=True, capture_output=True)  # noqa: ASYNC221
        await in_flight(stack.invoke, calls)
        subprocess.run(["callgrind_control", "-i", "off", str(pid)], check=True, capture_output=True)  # noqa: ASYNC221
        subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)  # noqa: ASYNC221
    dumps = sorted(work.glob("callgrind.out.*"), key=os.path.getmtime)  # noqa: ASYNC240
    return max((d for d in dumps), key=lambda d: d.stat().st_size)


def _sources(checkout: Path) -> str:
    """The PYTHONPATH that makes a checkout's packages win over the installed ones."""
    sources = sorted([*checkout.glob("libs/*/src"), *checkout.glob("services/*/src")])
    if not sources:
        raise SystemExit(f"{checkout}: no libs/*/src or services/*/src (a toolbus checkout?)")
    return ":".join(str(p) for p in sources)


async def compare(calls: int, before: Path, rounds: int) -> None:
    """Instructions per call of the code in `before` (a checkout of another commit) and of this
    one, alternately (the first of each pair swapping every round), beside each other."""
    pythonpath = _sources(before)
    print(f"commit {commit()['commit']} beside {before}; {calls} calls.invoke, 16 in flight:")
    got: dict[str, list[float]] = {"before": [], "after": []}
    for i in range(rounds):
        pair = [("before", pythonpath), ("after", "")]
        for label, path in pair if i % 2 == 0 else pair[::-1]:
            got[label].append(total_ir(await measure(calls, path)) / calls)
            print(f"  round {i + 1} {label:6s} {got[label][-1]:>12,.0f} instructions per call", flush=True)
    b, a = (sum(v) / len(v) for v in (got["before"], got["after"]))
    print(f"  mean   before {b:,.0f}  after {a:,.0f}  ({(a - b) / b:+.1%})")


async def main(calls: int, top: int) -> None:
    dump = await measure(calls)
    ir = total_ir(dump)
    print(f"commit {commit()['commit']}")
    print(f"{calls} calls.invoke of echo.echo, 16 in flight, 1 dispatcher under callgrind:")
    print(f"  {ir / calls:,.0f} instructions per call  (dump: {dump})")
    annotate = shutil.which("callgrind_annotate")
    if annotate and top:
        for flag, what in (("--inclusive=yes", "inclusive"), ("--inclusive=no", "own")):
            res = subprocess.run([annotate, flag, str(dump)], capture_output=True, text=True, check=False)  # noqa: ASYNC221
            rows = [ln for ln in res.stdout.splitlines() if re.match(r"\s*[\d,]+ \(", ln)]
            print(f"top {top} by {what} instructions:")
            for ln in [r for r in rows if "PROGRAM TOTALS" not in r][:top]:
                count, _, rest = ln.strip().partition(" ")
                name = rest.split(") ", 1)[-1]
                print(f"  {int(count.replace(',', '')) / calls:>12,.0f} per call  {name[:110]}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--before", type=Path, help="a checkout of another commit: compare with it")
    ap.add_argument("--rounds", type=int, default=2, help="pairs measured with --before")
    a = ap.parse_args()
    asyncio.run(compare(a.calls, a.before, a.rounds) if a.before else main(a.calls, a.top))
