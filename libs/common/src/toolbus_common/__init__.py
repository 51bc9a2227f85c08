"""Shared runtime of the toolbus services: settings, logging, connections, canonical JSON, the FastStream serving layer (`bus`)."""

from toolbus_common.bus import Bus, Routes
from toolbus_common.canonical import canonical_json, content_id, sha256_hex
from toolbus_common.clock import now_iso
from toolbus_common.connections import (
    connect_redis,
    ensure_kv,
    ensure_object_store,
    ensure_stream,
)
from toolbus_common.logging import get_logger, register_secret, scrub
from toolbus_common.runtime import Service, run_service
from toolbus_common.settings import Settings

__all__ = [
    "Bus",
    "Routes",
    "Service",
    "Settings",
    "canonical_json",
    "connect_redis",
    "content_id",
    "ensure_kv",
    "ensure_object_store",
    "ensure_stream",
    "get_logger",
    "now_iso",
    "register_secret",
    "run_service",
    "scrub",
    "sha256_hex",
]
