"""Structured logging: one event per line, JSON when not a TTY, secrets scrubbed.

Libraries log through `get_logger(__name__)` and never configure logging; `configure()` is called
once by a service's entry point. The scrubber masks every registered secret value and anything
that looks like an Authorization header, so a secret that slips into a message still never prints.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

_SECRETS: set[str] = set()
_SECRETS_LOCK = threading.Lock()
_AUTH_RE = re.compile(
    r"(?i)(authorization|bearer|token|api[-_]?key|secret|password)([\"'=:\s]+)"
    r"((?:bearer|basic|token)\s+)?([^\s\"',}]+)"
)
MASK = "**********"
_OWN = frozenset({"at", "level", "logger", "event", "exc"})
"""The JSON line's own keys: an `extra` of one of these names is written with a `_` after it."""


def register_secret(value: str | None) -> None:
    """Make sure `value` never appears in a log line (min length 4 to avoid masking noise)."""
    if value and len(value) >= 4:
        with _SECRETS_LOCK:
            _SECRETS.add(value)


def scrub(text: str) -> str:
    """Mask registered secrets and credential-looking `key: value` pairs in `text`."""
    for secret in tuple(_SECRETS):
        if secret in text:
            text = text.replace(secret, MASK)
    return _AUTH_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3) or ''}{MASK}", text)


class JsonFormatter(logging.Formatter):
    """`{"at", "level", "logger", "event", ...extra}` on one line."""

    _SKIP = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in self._SKIP and not key.startswith("_"):  # never over the line's own (_OWN)
                out[f"{key}_" if key in _OWN else key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return scrub(json.dumps(out, default=str, ensure_ascii=False))


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extras = {
            k: v for k, v in record.__dict__.items() if k not in JsonFormatter._SKIP and not k.startswith("_")
        }
        base = super().format(record)
        if extras:
            base += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return scrub(base)


def configure(level: str = "INFO", fmt: str = "auto") -> None:
    """Configure the root logger once: JSON when stderr is not a TTY (or `fmt="json"`)."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if use_json else TextFormatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpx2", "httpcore", "uvicorn.access", "mcp", "nats"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)


class Every:
    """Says whether a warning is due: once per `seconds` per key, so a flood logs one line."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._last: dict[str, float] = {}

    def due(self, key: str = "") -> bool:
        now = time.monotonic()
        if now - self._last.get(key, -self.seconds) < self.seconds:
            return False
        self._last[key] = now
        return True
