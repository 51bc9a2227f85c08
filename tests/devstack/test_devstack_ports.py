"""`make up` on a machine where other programs hold its ports: each service moves to a free port
(and says so), `TOOLBUS_PORT_BASE` places them all, `status` never takes another program's server
for one of ours, and the nats-server it starts is the newest it finds."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from toolbus_devstack import servers, stack
from toolbus_devstack.processes import port_in_use


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another program listens on for the length of the test."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_taken_port_is_replaced_by_a_free_one_and_named(taken_port: int) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    ports, moved = stack.service_ports({"registry": taken_port, "gateway": free})
    assert ports["gateway"] == free
    assert ports["registry"] != taken_port
    assert not port_in_use(ports["registry"])
    assert moved == [
        f"registry: port {taken_port} is taken by another program, so it listens on {ports['registry']}"
    ]


def test_every_service_in_the_list_gets_a_port_from_the_base() -> None:
    assert stack.wanted_ports(None) == stack.DEFAULT_PORTS
    based = stack.wanted_ports(9100)
    assert list(based) == list(stack.DEFAULT_PORTS)
    assert sorted(based.values()) == list(range(9100, 9100 + len(stack.DEFAULT_PORTS)))


class _Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_status_does_not_report_another_programs_server_as_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    foreign = HTTPServer(("127.0.0.1", 0), _Ready)  # answers /readyz 200, as a service would
    threading.Thread(target=foreign.serve_forever, daemon=True).start()
    try:
        port = foreign.server_address[1]
        monkeypatch.setenv("TOOLBUS_STACK_DIR", str(tmp_path / "stack"))
        stack.use_dir(tmp_path / "unused")
        monkeypatch.setattr(stack, "SERVICES", {"registry": port})
        report = stack.status_report()
        assert report["registry"] == {"pid": None, "port": None, "readyz": None, "portTaken": True}
        assert stack.status() == 0
        out = capsys.readouterr().out
        assert f"registry     not started by make up (port {port} is used by another program)" in out
        assert "/readyz -> 200" not in out
    finally:
        foreign.shutdown()
        foreign.server_close()


def _fake_nats_server(path: Path, version: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho 'nats-server: v{version}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_up_prefers_the_venvs_newer_nats_server_to_an_old_one_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    old = _fake_nats_server(tmp_path / "path" / "nats-server", "2.9.10")
    assert shutil.which("nats-server", path=str(tmp_path / "path")) == old
    new = _fake_nats_server(tmp_path / "venv" / "nats-server", "2.15.1")
    monkeypatch.setenv("PATH", f"{tmp_path / 'path'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(servers, "_wheel_nats_servers", lambda: [new])
    assert stack.nats_binary() == new
    assert capsys.readouterr().err == ""


def test_an_old_nats_server_is_used_only_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    old = _fake_nats_server(tmp_path / "path" / "nats-server", "2.9.10")
    monkeypatch.setenv("PATH", f"{tmp_path / 'path'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(servers, "_wheel_nats_servers", lambda: [])
    assert stack.nats_binary() == old
    assert "is nats-server 2.9.10: before 2.9.15" in capsys.readouterr().err
