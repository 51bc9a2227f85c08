"""`make bench`'s table works: a short run (10 calls per figure) against this session's NATS and
Redis produces every row of every section, with the commit, and `--json` is valid JSON whose rows
are the printed ones. No figure is checked against a time: only that it is there (or says why not).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("registry", "dispatcher", "approval", "credentials")
SECTIONS = {
    "call through the dispatcher",
    "memory (RSS)",
    "internal commands",
    "transport",
    "registration",
    "search",
    "declarations",
    "credential resolution",
    "Redis semaphore",
}


@pytest.fixture(scope="module")
def short_run(nats_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "table.json"
    env = {**os.environ, "TOOLBUS_NATS_URL": nats_url, "TOOLBUS_REDIS_URL": redis_url}
    done = subprocess.run(
        [sys.executable, "bench/table.py", "--calls", "10", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


def test_the_json_names_the_commit_and_every_section(short_run: tuple[str, Any]) -> None:
    _, data = short_run
    assert re.fullmatch(r"[0-9a-f]{40}", data["commit"])
    assert data["calls_per_figure"] == 10 and data["short"] is True
    assert {f["section"] for f in data["figures"]} == SECTIONS


def test_every_row_has_a_figure_or_says_why_not(short_run: tuple[str, Any]) -> None:
    _, data = short_run
    for f in data["figures"]:
        if f["value"] is None:
            assert f["note"].startswith(("not measured yet", "not in the table")), f
        else:
            assert isinstance(f["value"], (int, float)) and f["value"] >= 0, f
            if f["baseline"] is not None and f["baseline"] > 0:
                assert f["ratio"] == pytest.approx(f["value"] / f["baseline"]), f


def test_the_dispatcher_rows_cover_both_modes_and_one_and_two_processes(short_run: tuple[str, Any]) -> None:
    _, data = short_run
    names = {f["name"] for f in data["figures"] if f["section"] == "call through the dispatcher"}
    for processes in ("1 dispatcher", "2 dispatchers"):
        for mode in ("sequential", "16 in flight"):
            for what in ("p50", "p99", "calls/s"):
                assert f"calls.invoke, {processes}, {mode}: {what}" in names
        assert f"dispatcher CPU per call, {processes}, 16 in flight" in names
    measured = [f for f in data["figures"] if f["section"] == "call through the dispatcher"]
    assert all(f["value"] is not None and f["baseline"] for f in measured if "calls.invoke" in f["name"])


def test_the_added_time_of_a_call_is_shown_beside_its_floor(short_run: tuple[str, Any]) -> None:
    _, data = short_run
    (row,) = [f for f in data["figures"] if "sequential: p50 less direct McpConnection" in f["name"]]
    assert row["baseline_name"].startswith("floor: bare NATS round trip + the call's 2 Redis scripts")
    nats_ms, scripts_ms = (float(x) for x in re.findall(r"[\d.]+(?= ms| \+)", row["note"]))
    assert nats_ms > 0 and scripts_ms > 0
    assert row["baseline"] == pytest.approx(nats_ms + scripts_ms, abs=0.002)


def test_memory_rows_give_each_service_idle_and_after_calls(short_run: tuple[str, Any]) -> None:
    _, data = short_run
    rows = {f["name"]: f for f in data["figures"] if f["section"] == "memory (RSS)"}
    for service in SERVICES:
        assert rows[f"{service} idle"]["value"] > 0
        (after,) = [f for name, f in rows.items() if name.startswith(f"{service} after ")]
        assert after["value"] > 0 and after["baseline"] == rows[f"{service} idle"]["value"]


def test_the_printed_table_has_the_json_rows(short_run: tuple[str, Any]) -> None:
    stdout, data = short_run
    assert data["commit"] in stdout
    for f in data["figures"]:
        assert f["name"] in stdout


INTERNAL_OUTPUT = """
60 samples each (after 5 warm-up), tools answer at once; ms
what                                                    n      p50      p99      max
baseline: bare NATS request/reply (nats-py)            60     0.31     0.90     1.20
approvals.decide -> decision applied (event `at`)      60     7.10    12.00    14.00
runs.close -> approval cancelled (RunClosed applied)   60     9.50    20.00    25.00
"""
TRANSPORT_OUTPUT = """
3000 sequential request/replies x 3 rounds per path; µs
server side                            p50     p99  p50 over raw
raw nats-py subscription               200     400            +0
FastStream leanest                     350     700          +150
"""


def test_the_rows_of_the_transport_benches_are_read_from_their_output() -> None:
    """A short run skips bench/internal.py and bench/transport.py (they start their own stacks);
    the full run reads their printed tables, as here."""
    sys.path.insert(0, str(ROOT))
    from bench.table import parse_internal, parse_transport

    internal = {f.name: f for f in parse_internal(INTERNAL_OUTPUT)}
    decided = internal["approvals.decide -> decision applied (event `at`): p50"]
    assert (decided.value, decided.baseline) == (7.10, 0.31)
    assert internal["runs.close -> approval cancelled (RunClosed applied): p99"].baseline == 0.90
    assert len(internal) == 4
    (p50, p99) = parse_transport(TRANSPORT_OUTPUT)
    assert (p50.name, p50.value, p50.baseline) == (
        "request/reply served by FastStream leanest: p50",
        350,
        200,
    )
    assert (p99.value, p99.baseline) == (700, 400)
    assert parse_internal("no table here") == []
    assert parse_transport("") == []
