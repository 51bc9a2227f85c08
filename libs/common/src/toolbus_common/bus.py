"""The service framework's names where services have always imported them from; the code lives
in `toolbus_common.framework` (one module per job)."""

from __future__ import annotations

from toolbus_common.framework.asyncapi import asyncapi_document, iter_subjects
from toolbus_common.framework.bus import MAX_WORKERS, Bus, broker_options
from toolbus_common.framework.commands import (
    ACK_WAIT,
    INTERNAL_STREAM,
    MAX_DELIVERIES,
    PULL_TIMEOUT,
    RETRY_DELAY,
    Commands,
)
from toolbus_common.framework.metrics import COMMANDS, LATENCY, REPLY_FAILURES, REQUESTS, served
from toolbus_common.framework.replies import (
    HEADER_ROOM,
    RawJson,
    ReplyGuard,
    Result,
    encode_error,
    encode_ok,
    encode_reply,
    failure,
    misdirected_reply,
    publish_failed,
    too_large,
)
from toolbus_common.framework.routes import REQUEST_HEADERS, Entry, Routes, SubjectOf

__all__ = [
    "ACK_WAIT",
    "COMMANDS",
    "HEADER_ROOM",
    "INTERNAL_STREAM",
    "LATENCY",
    "MAX_DELIVERIES",
    "MAX_WORKERS",
    "PULL_TIMEOUT",
    "REPLY_FAILURES",
    "REQUESTS",
    "REQUEST_HEADERS",
    "RETRY_DELAY",
    "Bus",
    "Commands",
    "Entry",
    "RawJson",
    "ReplyGuard",
    "Result",
    "Routes",
    "SubjectOf",
    "asyncapi_document",
    "broker_options",
    "encode_error",
    "encode_ok",
    "encode_reply",
    "failure",
    "iter_subjects",
    "misdirected_reply",
    "publish_failed",
    "served",
    "too_large",
]
