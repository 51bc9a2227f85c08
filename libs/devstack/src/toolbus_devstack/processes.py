"""Processes and ports: spawn a logged child, stop it, read its log, find a free port."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", ""})


class ServerStartError(RuntimeError):
    """A local server or service did not come up; the message carries the tail of its log."""


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PICKED = 20000
"""`free_port` picks from here up to the start of the kernel's ephemeral range."""


def _ephemeral_start() -> int | None:
    """The first port Linux gives outgoing connections (`ip_local_port_range`), if known."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, for a server started next with it on its command
    line. Still racy, but less: it is picked at random below the kernel's ephemeral range (20000
    up to `ip_local_port_range`'s start, where there is room), so the local port of an outgoing
    connection, which the kernel takes from that range, can never be it; only another process
    binding the same port explicitly can. A port the OS picks (`bind(..., 0)`), the fallback, is
    from the ephemeral range itself. Where the server can take a socket, bind one with
    `listening_socket` and hand it over instead."""
    top = _ephemeral_start()
    if top is not None and top - LOWEST_PICKED >= 1000:
        for _ in range(64):
            port = random.randrange(LOWEST_PICKED, top)
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        picked: int = sock.getsockname()[1]
        return picked


def listening_socket(host: str = "127.0.0.1") -> socket.socket:
    """A TCP socket listening on a port the OS picks as it binds (`getsockname()[1]`), to hand
    to a child process (`spawn(pass_fds=...)`): the port is its own from the start."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, 0), family=family, backlog=128)


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


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this child if the thread that started it dies (pytest killed hard)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def open_own_log(path: Path) -> tuple[Path, IO[bytes]]:
    """A log file of this process's next child alone, open for appending (mode 0600), with an
    exclusive `flock` that the child inherits and holds while it runs: `path` itself unless a
    running process holds it, else `<stem>-2<suffix>`, `-3`, ... So a second process started
    with the same log path (a second dispatcher beside the first) writes a file of its own, and
    one started after the first ended appends to the first's file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    index = 1
    while True:
        candidate = path if index == 1 else path.with_name(f"{path.stem}-{index}{path.suffix}")
        fd = os.open(candidate, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            index += 1
            continue
        return candidate, os.fdopen(fd, "ab")


def spawn(
    argv: Sequence[str],
    log_path: Path | IO[bytes],
    *,
    env: Mapping[str, str] | None,
    detach: bool,
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start `argv` with stdout and stderr appended to `log_path` (created with mode 0600), or to
    an open log file (`open_own_log`, closed here once the child has it); `detach` lets it
    outlive us; `pass_fds` stay open in the child, under the same numbers."""
    if isinstance(log_path, Path):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log: IO[bytes] = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")
    else:
        log = log_path
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
            pass_fds=tuple(pass_fds),
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
