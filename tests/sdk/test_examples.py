"""The runnable examples the README points to run here, as a user runs them, against this
package's deployment: each exits 0 and prints what it promises."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def test_walkthrough(stack: dict[str, str]) -> None:
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(EXAMPLES / "walkthrough.py")],
        env={**os.environ, **stack},
        cwd=EXAMPLES,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for line in (
        "call    support.ask_user -> {'answer': 'yes (asked on attempt 1)'}",
        "call    http.fetch -> 200",
        "call    crm.refund of 100, under the rule -> {'refundId': 're_inv_1_100', 'amount': 100}",
        "approval crm.refund {'invoice_id': 'inv_1', 'amount': 1000} waiting",
        "call    crm.refund -> {'refundId': 're_inv_1_1000', 'amount': 1000}",
        "parked  1 call on a 401 from crm (toolset credentials); rotating",
        "call    crm.find_invoice after rotation -> {'id': 'inv_1'",
        "model   catalogue: - crm (mcp, ",
        "model   search_tools in ['crm'] -> ['crm.find_invoice'",
        "picks crm.find_invoice",
        "model   list_tools(crm) -> ['crm.find_invoice(",
        "done    run closed",
    ):
        assert line in out, line
    assert "'parked': 1" in out and "'resumed': 1" in out
