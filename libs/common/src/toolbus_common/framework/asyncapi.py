"""The AsyncAPI 3 document of a service's route tables."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import orjson
from faststream.specification import AsyncAPI
from toolbus_contracts.errors import ErrorCode

from toolbus_common.framework.bus import Bus
from toolbus_common.framework.routes import Routes
from toolbus_common.settings import Settings


def asyncapi_document(
    settings: Settings, tables: Sequence[Routes[Any]], *, title: str, description: str = ""
) -> dict[str, Any]:
    """The AsyncAPI 3 document FastStream generates for these route tables (registered on a broker
    that is never connected, so no handler runs), with each request's reply envelope added:
    FastStream 0.7 writes the request side of a subscriber only, so the reply messages and `reply`
    objects are built here from the same contract models."""
    spec = Bus(settings, name="spec", queue="spec")
    entries = [entry for table in tables for entry in table.entries]
    for entry in entries:
        spec.register(entry, None, raw_fast=False)
    doc: dict[str, Any] = orjson.loads(
        AsyncAPI(spec.broker, title=title, version="1.1", description=description, schema_version="3.0.0")
        .to_specification()
        .to_json()
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    messages = doc["components"].setdefault("messages", {})
    schemas["ErrorObject"] = _error_schema()
    for entry in entries:
        if entry.kind not in ("request", "deferred"):
            continue
        key = entry.subject(settings.subjects).removeprefix(settings.subjects.prefix + ".")
        data_ref: dict[str, Any] = {"type": "object"}
        if entry.reply is not None:
            reply_schema = entry.reply.model_json_schema(
                by_alias=True, ref_template="#/components/schemas/{model}"
            )
            schemas.update(reply_schema.pop("$defs", {}))
            schemas[entry.reply.__name__] = reply_schema
            data_ref = {"$ref": f"#/components/schemas/{entry.reply.__name__}"}
        name = f"{key}:Reply"
        messages[name] = {
            "title": name,
            "payload": {
                "oneOf": [
                    {
                        "type": "object",
                        "properties": {"ok": {"const": True}, "data": data_ref},
                        "required": ["ok", "data"],
                        "additionalProperties": False,
                    },
                    {
                        "type": "object",
                        "properties": {
                            "ok": {"const": False},
                            "error": {"$ref": "#/components/schemas/ErrorObject"},
                        },
                        "required": ["ok", "error"],
                        "additionalProperties": False,
                    },
                ]
            },
        }
        channel = doc["channels"][key]
        channel["messages"]["Reply"] = {"$ref": f"#/components/messages/{name}"}
        doc["operations"][key]["reply"] = {
            "address": {
                "location": "$message.header#/reply",
                "description": "the request's NATS reply subject",
            },
            "channel": {"$ref": f"#/channels/{key}"},
            "messages": [{"$ref": f"#/channels/{key}/messages/Reply"}],
        }
    ordered: dict[str, Any] = _sorted(doc)
    return ordered


def _error_schema() -> dict[str, Any]:
    return {
        "title": "ErrorObject",
        "type": "object",
        "properties": {
            "code": {"type": "string", "enum": [c.value for c in ErrorCode]},
            "message": {"type": "string"},
            "details": {"type": "object"},
        },
        "required": ["code", "message"],
    }


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def iter_subjects(doc: dict[str, Any]) -> Iterator[str]:
    """Every channel address of a document, sorted."""
    yield from sorted(ch["address"] for ch in doc.get("channels", {}).values())
