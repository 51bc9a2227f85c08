"""The `toolbus` CLI through its installed entry point, in subprocesses, against the real services:
`--json` output parsed, the exit codes a script tests, one-line errors."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from toolbus import Toolbus

from tests.support.mcp_servers import McpTestServer

pytestmark = pytest.mark.e2e

TOOLBUS = str(Path(sys.executable).with_name("toolbus"))


async def cli(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **env}
    return await asyncio.to_thread(
        subprocess.run,
        [TOOLBUS, *args],
        env=full,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def ok_json(env: dict[str, str], *args: str) -> Any:
    done = await cli(env, *args, "--json")
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return json.loads(done.stdout)


@pytest.mark.timeout(300)  # about twenty CLI processes, each ~1-4 s on a busy 2-core machine
async def test_cli_commands_json_and_exit_codes(
    stack: dict[str, str], tb: Toolbus, mcp_server: McpTestServer, tmp_path: Path
) -> None:
    env = {k: stack[k] for k in ("TOOLBUS_NATS_URL", "TOOLBUS_SUBJECT_PREFIX")}
    spec = tmp_path / "toolset.yaml"
    spec.write_text(
        f"mcp:\n  - name: everything\n    url: {mcp_server.url}\n    policies:\n      plain: {{approval: true}}\n"
    )
    created = await ok_json(env, "toolsets", "create", "-f", str(spec))
    toolset_id = created["id"]
    assert toolset_id.startswith("ts_") and "everything.echo" in [t["name"] for t in created["tools"]]
    assert "everything.echo" in created["declarations"]["prompt"]

    got = await ok_json(env, "toolsets", "get", toolset_id)
    assert [t["name"] for t in got["tools"]] == [t["name"] for t in created["tools"]]
    wide = {**env, "COLUMNS": "200"}  # tables fold long cells to the terminal's width
    table = await cli(wide, "toolsets", "get", toolset_id)
    assert table.returncode == 0 and f"{toolset_id}  ({len(created['tools'])} tools)" in table.stdout
    plain = [line.split("│") for line in table.stdout.splitlines() if "everything.plain" in line]
    assert [[cell.strip() for cell in row[1:4]] for row in plain] == [["everything.plain", "mcp", "yes"]], (
        table.stdout
    )
    hits = await ok_json(env, "toolsets", "search", toolset_id, "report a tool error", "--limit", "1")
    assert [h["name"] for h in hits["tools"]] == ["everything.fail"]
    namespaces = await ok_json(env, "toolsets", "namespaces", toolset_id)
    assert [(n["name"], n["kind"], n["toolCount"]) for n in namespaces["namespaces"]] == [
        ("everything", "mcp", 4)
    ]
    table = await cli(wide, "toolsets", "namespaces", toolset_id)
    assert table.returncode == 0 and "(1 namespaces)" in table.stdout and "everything" in table.stdout
    scoped = await ok_json(env, "toolsets", "search", toolset_id, "echo", "-s", "everything", "-n", "2")
    assert {h["namespace"] for h in scoped["tools"]} == {"everything"}
    outside = await cli(env, "toolsets", "search", toolset_id, "echo", "--namespace", "nope")
    assert outside.returncode == 5 and outside.stderr.startswith("error: invalidRequest: ")
    browsed = await cli(env, "toolsets", "declarations", toolset_id, "--namespace", "everything")
    assert browsed.returncode == 0 and browsed.stdout.startswith("everything.")
    dts = await cli(env, "toolsets", "declarations", toolset_id, "--format", "dts")
    assert dts.returncode == 0 and dts.stdout == created["declarations"]["dts"].rstrip("\n") + "\n"

    run_id = (await ok_json(env, "runs", "open", toolset_id, "--namespace", "cli-user"))["runId"]
    done = await ok_json(env, "calls", "invoke", "everything.echo", "--run", run_id, "-i", '{"text": "cli"}')
    assert done["outcome"] == {"status": "ok", "output": {"text": "cli"}}
    status = await ok_json(env, "calls", "get", done["callId"])
    assert status["state"] == "done" and status["outcome"]["output"] == {"text": "cli"}

    failed = await cli(
        env, "calls", "invoke", "everything.fail", "--run", run_id, "-i", '{"text": "x"}', "--json"
    )
    assert failed.returncode == 6
    assert json.loads(failed.stdout)["outcome"]["error"]["code"] == "toolError"
    unknown = await cli(env, "calls", "invoke", "everything.nope", "--run", run_id)
    assert unknown.returncode == 4
    assert unknown.stderr.startswith("error: unknownTool: ") and unknown.stderr.count("\n") == 1
    refused = await cli(env, "calls", "invoke", "everything.echo", "--run", run_id, "-i", '{"text": 5}')
    assert refused.returncode == 5 and refused.stderr.startswith("error: invalidInput: ")

    # An approval, from the CLI end to end.
    started = await ok_json(
        env, "calls", "start", "everything.plain", "--run", run_id, "-i", '{"text": "ok?"}'
    )
    for _ in range(200):  # wait in-process (a CLI start per poll would be slow)
        if await tb.approvals.list(run_id=run_id):
            break
        await asyncio.sleep(0.05)
    pending = (await ok_json(env, "approvals", "list", "--run", run_id))["approvals"]
    assert [a["callId"] for a in pending] == [started["callId"]]
    table = await cli(wide, "approvals", "list", "--run", run_id)
    assert table.returncode == 0 and "1 pending approval(s)" in table.stdout
    assert pending[0]["approvalId"] in table.stdout
    decided = await ok_json(env, "approvals", "approve", pending[0]["approvalId"])
    assert decided == {"approvalId": pending[0]["approvalId"], "decision": "approved"}
    again = await cli(env, "approvals", "deny", pending[0]["approvalId"], "--json")
    assert again.returncode == 5 and json.loads(again.stdout)["error"]["code"] == "conflict"

    level = await ok_json(
        env,
        "credentials",
        "set",
        "--level",
        "run",
        "--run",
        run_id,
        "--header",
        "everything:X-Api-Key=secret-cli-value",
    )
    assert level == {"level": "run"}
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({"servers": {"everything": {"headers": {"X-Api-Key": "v2"}}}}))
    assert (
        await ok_json(
            env, "credentials", "set", "--level", "toolset", "--toolset", toolset_id, "-f", str(creds)
        )
    ) == {"level": "toolset"}

    tail = await cli(env, "events", "tail", "--run", run_id, "--no-follow", "--json")
    assert tail.returncode == 0
    events = [json.loads(line) for line in tail.stdout.splitlines()]
    assert {e["type"] for e in events} >= {
        "accepted",
        "attemptStarted",
        "completed",
        "approvalRequested",
        "approved",
    }
    assert "secret-cli-value" not in tail.stdout

    closed = await ok_json(env, "runs", "close", run_id)
    assert closed["runId"] == run_id

    nobody = await cli(
        {**env, "TOOLBUS_SUBJECT_PREFIX": "tbnobodyhere"},
        "--timeout",
        "2",
        "toolsets",
        "get",
        toolset_id,
        "--json",
    )
    assert nobody.returncode == 3 and json.loads(nobody.stdout)["error"]["code"] == "unavailable"
    usage = await cli(env, "toolsets", "create", "-f", str(tmp_path / "absent.yaml"))
    assert usage.returncode == 2 and usage.stderr.startswith("error: cannot read ")
    # An unknown field in a spec is invalidRequest naming it, at the top as one level down.
    for body, field in (
        ('{"mcp": [], "extra": 1}', "extra"),
        ('{"mcp": [{"name": "e", "url": "http://127.0.0.1:1/mcp", "x": 1}]}', "mcp[0].x"),
    ):
        spec_file = tmp_path / "unknown.json"
        spec_file.write_text(body)
        refused = await cli(env, "toolsets", "create", "-f", str(spec_file), "--json")
        assert refused.returncode == 5, refused.stderr
        error = json.loads(refused.stdout)["error"]
        assert error["code"] == "invalidRequest" and error["details"]["field"] == field, error


async def test_cli_status_outside_the_repository(tmp_path: Path) -> None:
    env = {"TOOLBUS_STACK_DIR": str(tmp_path / "stack")}
    done = await asyncio.to_thread(
        subprocess.run,
        [TOOLBUS, "status", "--json"],
        env={**os.environ, **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["stackDir"] == str(tmp_path / "stack")
    assert set(report["processes"]) == {
        "nats",
        "redis",
        "registry",
        "dispatcher",
        "approval",
        "credentials",
        "gateway",
    }
    assert report["processes"]["nats"]["pid"] is None
    down = await asyncio.to_thread(
        subprocess.run,
        [TOOLBUS, "down"],
        env={**os.environ, **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert down.returncode == 0 and "nothing to stop" in down.stdout


async def test_cli_logs_json_gives_one_object_per_line(tmp_path: Path) -> None:
    stack = tmp_path / "stack"
    (stack / "logs").mkdir(parents=True)
    record = {"level": "INFO", "event": "service started", "service": "registry"}
    (stack / "logs" / "registry.log").write_text(
        "old line\n" + json.dumps(record) + "\nnot json: a traceback line\n"
    )
    (stack / "logs" / "dispatcher.log").write_text(json.dumps({"event": "ready"}) + "\n")
    done = await asyncio.to_thread(
        subprocess.run,
        [TOOLBUS, "logs", "-n", "2", "--json"],
        env={**os.environ, "TOOLBUS_STACK_DIR": str(stack)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert {"log": "registry", "record": record} in lines
    assert {"log": "registry", "line": "not json: a traceback line"} in lines
    assert {"log": "dispatcher", "record": {"event": "ready"}} in lines
    assert all(entry.get("line") != "old line" for entry in lines)  # -n 2: the last two lines only


@pytest.mark.timeout(120)
async def test_cli_refuses_what_is_no_run_id_or_timeout(stack: dict[str, str], tmp_path: Path) -> None:
    env = {k: stack[k] for k in ("TOOLBUS_NATS_URL", "TOOLBUS_SUBJECT_PREFIX")}
    # A run id becomes a subject token: a wildcard would tail every run's events.
    for run in ("*", ">", "", "bad run!"):
        tail = await cli(env, "events", "tail", "--run", run, "--no-follow", "--json")
        assert tail.returncode == 5, (run, tail.stdout, tail.stderr)
        error = json.loads(tail.stdout)["error"]
        assert error["code"] == "invalidRequest" and error["details"] == {"field": "runId"}
        assert "Traceback" not in tail.stderr
    # Fields are named as on the wire, as the services name them.
    bad = await cli(env, "calls", "get", "bad id", "--json")
    assert bad.returncode == 5 and json.loads(bad.stdout)["error"]["details"] == {"field": "callId"}
    for timeout in ("-1", "0", "nan", "inf"):
        usage = await cli(env, "--timeout", timeout, "toolsets", "get", "ts_" + "0" * 64)
        assert usage.returncode == 2 and usage.stderr.startswith("error: --timeout must be"), usage.stderr
    for nan in ('{"a": NaN}', '{"a": -Infinity}', '{"a": 1e400}'):  # Python's json reader takes them
        usage = await cli(env, "calls", "invoke", "e.echo", "--run", "r1", "--input", nan)
        assert usage.returncode == 2 and "--input is not JSON" in usage.stderr, usage.stderr
    clear, headless = tmp_path / "clear.json", tmp_path / "headless.json"
    clear.write_text('{"servers": {}}')  # clears a level: gets past the CLI to the service (no such run)
    headless.write_text('{"headers": {"X-A": "v"}}')
    cleared = await cli(env, "credentials", "set", "--level", "run", "--run", "no-such-run", "-f", str(clear))
    assert cleared.returncode == 4, cleared.stderr
    wrong = await cli(env, "credentials", "set", "--level", "run", "--run", "r1", "-f", str(headless))
    assert wrong.returncode == 2 and "must hold {servers:" in wrong.stderr, wrong.stderr
    yaml_nan = tmp_path / "input.yaml"
    yaml_nan.write_text("a: [1, .nan]\n")
    usage = await cli(env, "calls", "invoke", "e.echo", "--run", "r1", "--input", f"@{yaml_nan}")
    assert usage.returncode == 2 and "at a[1]" in usage.stderr, usage.stderr  # as JSON's NaN: usage
    for prefix in ("a b", "", "x.*"):  # was a BadSubjectError traceback, exit 1
        usage = await cli(env, "--prefix", prefix, "toolsets", "get", "ts_" + "0" * 64)
        assert usage.returncode == 2 and usage.stderr.startswith("error: --prefix"), usage.stderr
        assert "Traceback" not in usage.stderr
    # With --json the argument parser's own errors are one JSON document too (were plain text).
    for args in (("--json", "calls", "get"), ("calls", "get", "--json", "a", "b"), ("--json", "nosuch")):
        usage = await cli(env, *args)
        assert usage.returncode == 2 and json.loads(usage.stdout)["error"]["code"] == "usage", usage
    plain = await cli(env, "calls", "get")
    assert plain.returncode == 2 and "Missing argument" in plain.stderr and not plain.stdout
