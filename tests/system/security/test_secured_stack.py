"""`make up` with `TOOLBUS_SECURE=1` (scripts/stack.py): its own NATS with deploy/nats/'s users
and a Redis with a password, dev credentials generated, the four services each connected as its
own user; then a representative end-to-end run through it with the client roles' credentials:
a harness registers a toolset and calls an MCP tool, a host tool answered by a `worker`, and an
approval-gated tool decided by an `approver`; the harness's own attempt to decide is refused.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import nats
import pytest
import redis
from toolbus_nats_connect import NatsAuth

from tests.devstack.test_infra_stack import _stack
from tests.support.infra import port_in_use, request_ok, unique_prefix
from tests.support.mcp_servers import McpTestServer

pytestmark = pytest.mark.e2e


def _port_base() -> int:
    """Four consecutive free ports below the ephemeral range, so that the servers `up` starts on
    OS-chosen free ports cannot take one of them meanwhile."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        base = secrets.randbelow(low - 20000 - 4) + 20000
        if not any(port_in_use(base + i) for i in range(4)):
            return base
    raise AssertionError("no four free consecutive ports")


def _env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line)


@asynccontextmanager
async def connect(env: dict[str, str], errors: list[str]) -> AsyncIterator[Any]:
    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(**NatsAuth.from_env(env).connect_options(), error_cb=on_error, connect_timeout=5)
    try:
        yield nc
    finally:
        await nc.close()


async def test_secure_stack_runs_calls_with_each_role_on_its_own_user(tmp_path: Path) -> None:
    prefix = unique_prefix("tbsec")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLBUS_")}
    env |= {
        "TOOLBUS_SECURE": "1",
        "TOOLBUS_STACK_DIR": str(tmp_path / "stack"),
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_LOG_LEVEL": "WARNING",
    }
    base = _port_base()
    secure_dir = tmp_path / "stack" / "secure"
    try:
        up = _stack(env, "up", "--port-base", str(base), timeout=180)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "secured (deploy/nats/" in up.stdout
        assert "with a password, started here" in up.stdout
        for name in ("registry", "dispatcher", "approval", "credentials"):
            assert f"{name:<15} ready" in up.stdout
        passwords_file = secure_dir / "passwords.json"
        assert stat.S_IMODE(passwords_file.stat().st_mode) == 0o600
        passwords = json.loads(passwords_file.read_text())
        for secret in passwords.values():
            assert secret not in up.stdout + up.stderr
        logs = "".join(p.read_text() for p in (tmp_path / "stack" / "logs").glob("*.log"))
        assert not [name for name, secret in passwords.items() if secret in logs]

        run_id = await _run_through(prefix, secure_dir)
        _no_service_was_refused(tmp_path / "stack", passwords)
        _redis_users_reach_only_their_keys(prefix, tmp_path / "stack", passwords)
        _credentials_user_reads_run_keys_only(prefix, tmp_path / "stack", passwords, run_id)
        _stack_files_are_private(tmp_path / "stack")
    finally:
        down = _stack(env, "down")
    assert down.returncode == 0, down.stdout + down.stderr


async def _run_through(prefix: str, secure_dir: Path) -> str:
    """The flow of the module docstring; returns the id of the run it opened (and closed)."""
    harness_env = _env_file(secure_dir / "harness.env")
    worker_env = _env_file(secure_dir / "worker.env")
    approver_env = _env_file(secure_dir / "approver.env")
    p = prefix
    harness_errors: list[str] = []
    worker_errors: list[str] = []
    async with (
        McpTestServer(name="shop") as mcp,
        connect(harness_env, harness_errors) as harness,
        connect(worker_env, worker_errors) as worker,
        connect(approver_env, []) as approver,
    ):
        # The worker serves a host tool in the workers' queue group.
        async def serve(msg: Any) -> None:
            task = json.loads(msg.data)
            # The reply subject is host.result.<callId>.<token>: the worker may publish there once.
            assert msg.reply.startswith(f"{p}.host.result.{task['callId']}.")
            out = {"attempt": task["attempt"], "output": {"name": f"customer {task['input']['id']}"}}
            await worker.publish(msg.reply, json.dumps(out).encode())

        await worker.subscribe(f"{p}.host.call.crm.lookup", queue="toolbus-workers", cb=serve)
        # The approver approves whatever is requested.
        requested: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def on_requested(msg: Any) -> None:
            requested.put_nowait(json.loads(msg.data))

        await approver.subscribe(f"{p}.events.approvals.requested", cb=on_requested)
        await worker.flush()
        await approver.flush()

        spec = {
            "mcp": [{"name": "shop", "url": mcp.url, "policies": {"echo": {"approval": True}}}],
            "host": [
                {
                    "name": "crm.lookup",
                    "description": "Find a customer.",
                    "inputSchema": {
                        "type": "object",
                        "properties": {"id": {"type": "string"}},
                        "required": ["id"],
                    },
                }
            ],
        }
        toolset = await request_ok(harness, f"{p}.toolsets.create", spec, timeout=60)
        run = await request_ok(harness, f"{p}.runs.open", {"toolsetId": toolset["id"], "namespace": "user-1"})
        run_id = run["runId"]

        plain = await request_ok(
            harness, f"{p}.calls.invoke", {"runId": run_id, "tool": "shop.plain", "input": {"text": "hi"}}
        )
        assert plain["outcome"]["status"] == "ok", plain
        host = await request_ok(
            harness, f"{p}.calls.invoke", {"runId": run_id, "tool": "crm.lookup", "input": {"id": "42"}}
        )
        assert host["outcome"] == {"status": "ok", "output": {"name": "customer 42"}}

        invoke = asyncio.create_task(
            request_ok(
                harness,
                f"{p}.calls.invoke",
                {"runId": run_id, "tool": "shop.echo", "input": {"text": "pay"}},
                60,
            )
        )
        approval = await asyncio.wait_for(requested.get(), 30)
        # The harness may not decide its own call: the server refuses the publish.
        await harness.publish(
            f"{p}.approvals.decide",
            json.dumps({"approvalId": approval["approvalId"], "approve": True}).encode(),
        )
        await harness.flush()
        decided = await request_ok(
            approver, f"{p}.approvals.decide", {"approvalId": approval["approvalId"], "approve": True}
        )
        assert decided["decision"] == "approved"
        echo = await invoke
        assert echo["outcome"] == {"status": "ok", "output": {"text": "pay"}}
        for _ in range(250):  # bounded: the refusal is reported asynchronously
            if any(f'"{p}.approvals.decide"' in e for e in harness_errors):
                break
            await asyncio.sleep(0.02)
        assert any(
            "permissions violation for publish" in e and f'"{p}.approvals.decide"' in e
            for e in harness_errors
        )
        assert [c.tool for c in mcp.calls] == ["plain", "echo"]
        # Credentials through the credentials service's own Redis user, then a call that uses them.
        creds = {"servers": {"shop": {"headers": {"X-Api-Key": "k-1"}}}}
        level = await request_ok(
            harness, f"{p}.toolsets.credentials.set", {"toolsetId": toolset["id"], "credentials": creds}
        )
        assert level == {"level": "toolset"}
        run_level = await request_ok(
            harness, f"{p}.runs.credentials.set", {"runId": run_id, "credentials": creds}
        )
        assert run_level == {"level": "run"}
        again = await request_ok(
            harness, f"{p}.calls.invoke", {"runId": run_id, "tool": "shop.plain", "input": {"text": "k"}}
        )
        assert again["outcome"]["status"] == "ok", again
        await request_ok(harness, f"{p}.runs.close", {"runId": run_id})
        return str(run_id)


def _redis_port(stack: Path) -> int:
    url = json.loads((stack / "pids" / "redis.json").read_text())["url"]
    return int(url.rsplit(":", 1)[1].split("/")[0])


def _no_service_was_refused(stack: Path, passwords: dict[str, str]) -> None:
    """The run-through (calls, a host tool, an approval, credentials at two levels, a close)
    needed no command or key the services' ACL users lack: Redis logged no refusal."""
    admin = redis.Redis(port=_redis_port(stack), password=passwords["redis"])
    try:
        refused = admin.acl_log()
    finally:
        admin.close()
    assert refused == [], refused


def _credentials_user_reads_run_keys_only(
    prefix: str, stack: Path, passwords: dict[str, str], run_id: str
) -> None:
    """The credentials service checks that a run exists (the dispatcher's run hash): it may read
    that key, and neither change nor delete it, directly or from a script."""
    run_key = f"{prefix}:run:{{{run_id}}}"
    client = redis.Redis(
        port=_redis_port(stack), username="credentials", password=passwords["redis-credentials"]
    )
    try:
        assert client.hget(run_key, "state") == b"closed"
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.hset(run_key, "state", "open")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.delete(run_key)
        touch = client.register_script("return redis.call('HSET', KEYS[1], 'state', 'open')")
        with pytest.raises(redis.exceptions.NoPermissionError):
            touch(keys=[run_key])
        assert client.hget(run_key, "state") == b"closed"
    finally:
        client.close()


def _stack_files_are_private(stack: Path) -> None:
    """Logs, the Redis append-only files (encrypted credentials), the JetStream store and
    `secure/`: directories 0700, files 0600, none readable by anyone but their owner."""
    seen = {"logs": 0, "redis-secure": 0, "nats-secure": 0, "secure": 0}
    loose = []
    for path in [stack, *stack.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_symlink():
            continue
        top = path.relative_to(stack).parts[:1]
        if top and top[0] in seen and path.is_file():
            seen[top[0]] += 1
        if mode != (0o700 if path.is_dir() else 0o600):
            loose.append(f"{path.relative_to(stack)} {mode:o}")
    assert all(seen.values()), seen  # each holds files: the check looked at real ones
    assert loose == []


def _redis_users_reach_only_their_keys(prefix: str, stack: Path, passwords: dict[str, str]) -> None:
    """The ACL: credentials keys for the credentials service and the dispatcher only."""
    port = _redis_port(stack)
    cred_key = f"{prefix}:cred:toolset:ts_x"
    results: dict[str, bool] = {}
    for user in ("dispatcher", "credentials", "approval"):
        client = redis.Redis(port=port, username=user, password=passwords[f"redis-{user}"])
        try:
            client.get(cred_key)
            results[user] = True
        except redis.exceptions.NoPermissionError:
            results[user] = False
        finally:
            client.close()
    assert results == {"dispatcher": True, "credentials": True, "approval": False}
    approval = redis.Redis(port=port, username="approval", password=passwords["redis-approval"])
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            approval.flushall()
        approval.zcard(f"{prefix}:{{approvals}}:pending")  # its own keys: allowed
    finally:
        approval.close()
