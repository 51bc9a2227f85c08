"""The committed AsyncAPI document is what the code generates, and it names every subject."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import yaml
from toolbus_common.bus import iter_subjects

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("toolbus_asyncapi_script", ROOT / "scripts" / "asyncapi.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_committed_asyncapi_matches_the_code() -> None:
    generator = _generator()
    committed = (ROOT / "docs" / "asyncapi.yaml").read_text(encoding="utf-8")
    assert committed == generator.render(), "docs/asyncapi.yaml is stale: run `make docs`"


def test_document_is_asyncapi_3_with_every_public_subject_and_reply_schemas() -> None:
    doc = yaml.safe_load((ROOT / "docs" / "asyncapi.yaml").read_text(encoding="utf-8"))
    assert doc["asyncapi"] == "3.0.0"
    subjects = set(iter_subjects(doc))
    for rest in (
        "toolsets.create", "toolsets.get", "toolsets.declarations", "toolsets.search",
        "workflows.publish", "workflows.get", "runs.open", "runs.close", "calls.start",
        "calls.invoke", "calls.get", "approvals.list", "approvals.decide",
        "toolsets.credentials.set", "namespaces.credentials.set", "runs.credentials.set",
        "events.calls.{runId}.{callId}", "events.approvals.requested", "events.credentials.expired",
        "host.call.{tool}", "host.heartbeat.>", "host.result.>", "workflows.start.{name}",
        "internal.approvals.needed", "internal.approvals.decided", "internal.credentials.park",
        "internal.calls.resume", "internal.runs.closed",
    ):  # fmt: skip
        assert f"toolbus.{rest}" in subjects, rest
    # A request documents its body and its reply envelope, both from the contract models.
    invoke = doc["operations"]["calls.invoke"]
    assert invoke["action"] == "receive"
    assert invoke["reply"]["messages"] == [{"$ref": "#/channels/calls.invoke/messages/Reply"}]
    reply = doc["components"]["messages"]["calls.invoke:Reply"]["payload"]["oneOf"]
    assert reply[0]["properties"]["data"] == {"$ref": "#/components/schemas/CallInvokeReply"}
    assert "unavailable" in doc["components"]["schemas"]["ErrorObject"]["properties"]["code"]["enum"]
    request = doc["components"]["messages"]["calls.invoke:SubscribeMessage"]["payload"]
    assert request == {"$ref": "#/components/schemas/CallStartRequest"}
    assert doc["components"]["schemas"]["CallStartRequest"]["additionalProperties"] is False
    # Two services consume runs.closed, each with its own operation.
    assert {"internal.runs.closed:approval", "internal.runs.closed:credentials"} <= set(doc["operations"])
