"""`bench/cpu.py` reads `strace -c` summaries into per-syscall counts (the total row left out)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.cpu import parse

STRACE = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 60.57    0.178339           6     27018           getpid
 11.00    0.032384          10      2998        12 write
  1.41    0.004138          11       376           writev
------ ----------- ----------- --------- --------- ----------------
100.00    0.294438           6     30392        12 total
"""


def test_strace_summary_counts_per_syscall() -> None:
    assert parse(STRACE) == {"getpid": 27018, "write": 2998, "writev": 376}
