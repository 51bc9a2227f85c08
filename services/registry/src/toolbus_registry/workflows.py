"""Published workflows in a JetStream key-value bucket: `<name>.<version>` holds the workflow,
`<name>.latest` the newest version. The version is content-addressed."""

from __future__ import annotations

import re

from nats.js.errors import KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from pydantic import ValidationError
from toolbus_common.canonical import sha256_hex
from toolbus_common.clock import now_iso
from toolbus_common.integrity import StoredCopyAltered, altered
from toolbus_contracts import Workflow, WorkflowPublishRequest
from toolbus_contracts.base import unfit_number, unfit_number_error
from toolbus_contracts.errors import InvalidRequest

_VERSION = re.compile(r"[0-9a-f]{12}")


def workflow_version(req: WorkflowPublishRequest) -> str:
    """First 12 hex digits of the SHA-256 of the canonical content (name included)."""
    return sha256_hex(req.model_dump(mode="json", exclude_none=True))[:12]


def verified(name: str, version: str, data: bytes) -> Workflow:
    """The workflow stored under `<name>.<version>` if its content is what that version
    addresses, else `StoredCopyAltered` (logged, naming `name@version`)."""
    try:
        workflow = Workflow.model_validate_json(data)
        content = WorkflowPublishRequest(
            name=workflow.name,
            description=workflow.description,
            input_schema=workflow.input_schema,
            output_schema=workflow.output_schema,
            definition=workflow.definition,
        )
    except ValidationError:
        raise altered("workflow", f"{name}@{version}", field="version") from None
    if workflow.name != name or workflow.version != version or workflow_version(content) != version:
        raise altered("workflow", f"{name}@{version}", field="version")
    return workflow


class WorkflowStore:
    def __init__(self, kv: KeyValue, *, max_bytes: int) -> None:
        self._kv = kv
        self._max_bytes = max_bytes
        """The largest stored workflow: what a `workflows.get` reply (and a KV entry) can carry."""

    async def publish(self, req: WorkflowPublishRequest) -> Workflow:
        """Store a version (a no-op when the same content is published again) and make it latest."""
        for field, value in (
            ("inputSchema", req.input_schema),
            ("outputSchema", req.output_schema),
            ("definition", req.definition),
        ):
            unfit = unfit_number(value, (field,))
            if unfit is not None:  # stored, it could never be read back and sent (orjson refuses it)
                raise unfit_number_error(unfit)
        version = workflow_version(req)
        try:
            existing = await self.get(req.name, version)
        except StoredCopyAltered:
            existing = None  # written again with the content its version addresses
        workflow = existing or Workflow(
            name=req.name,
            version=version,
            description=req.description,
            input_schema=req.input_schema,
            output_schema=req.output_schema,
            definition=req.definition,
            published_at=now_iso(),
        )
        if existing is None:
            stored = workflow.model_dump_json(exclude_none=True).encode()
            if len(stored) > self._max_bytes:  # stored, it could not be read back in one message
                raise InvalidRequest(
                    f"The workflow is {len(stored)} bytes as stored, over the {self._max_bytes} that "
                    "workflows.get can send in one NATS message: make its definition smaller.",
                    details={"field": "body", "size": len(stored), "limit": self._max_bytes},
                )
            await self._kv.put(f"{req.name}.{version}", stored)
        await self._kv.put(f"{req.name}.latest", version.encode())
        return workflow

    async def get(self, name: str, version: str | None = None) -> Workflow | None:
        """The version stored (the latest without `version`), None if there is none; raises
        `StoredCopyAltered` (logged) for a copy that is not what its version addresses."""
        try:
            if version is None:
                latest = await self._kv.get(f"{name}.latest")
                if not latest.value:
                    return None
                version = latest.value.decode(errors="replace")
                if not _VERSION.fullmatch(version):
                    raise altered("workflow", f"{name}@latest", field="name")
            entry = await self._kv.get(f"{name}.{version}")
        except (KeyNotFoundError, NotFoundError):
            return None
        if not entry.value:
            raise altered("workflow", f"{name}@{version}", field="version")
        return verified(name, version, entry.value)
