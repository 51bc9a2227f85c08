"""The dispatcher's instructions per call, counted by valgrind's callgrind: repeatable where times
on a loaded machine are not. The dispatcher runs under `valgrind --tool=callgrind` with
instrumentation off; after a warm-up it is switched on for `--calls` `calls.invoke` of the echo tool
with 16 in flight, then dumped. Prints instructions per call and the top functions by inclusive and
own instructions (`callgrind_annotate`).

    uv run python bench/callgrind.py [--calls 400] [--top 25]

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


async def main(calls: int, top: int) -> None:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind not found")
    work = Path(tempfile.mkdtemp(prefix="callgrind-"))
    out = work / "callgrind.out"
    wrapper = work / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"exec {valgrind} --tool=callgrind --instr-atstart=no --callgrind-out-file={out}.%p "
        f'{sys.executable} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    async with BenchStack(
        ("registry", "dispatcher"), python={"dispatcher": str(wrapper)}, ready=600
    ) as stack:
        pid = stack.services["dispatcher"].proc.pid
        await in_flight(stack.invoke, 200)  # warm: imports, connections, caches
        subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-i", "on", str(pid)], check=True, capture_output=True)
        await in_flight(stack.invoke, calls)
        subprocess.run(["callgrind_control", "-i", "off", str(pid)], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    dumps = sorted(work.glob("callgrind.out.*"), key=os.path.getmtime)
    dump = max((d for d in dumps), key=lambda d: d.stat().st_size)
    ir = total_ir(dump)
    print(f"commit {commit()['commit']}")
    print(f"{calls} calls.invoke of echo.echo, 16 in flight, 1 dispatcher under callgrind:")
    print(f"  {ir / calls:,.0f} instructions per call  (dump: {dump})")
    annotate = shutil.which("callgrind_annotate")
    if annotate and top:
        for flag, what in (("--inclusive=yes", "inclusive"), ("--inclusive=no", "own")):
            res = subprocess.run([annotate, flag, str(dump)], capture_output=True, text=True, check=False)
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
    a = ap.parse_args()
    asyncio.run(main(a.calls, a.top))
