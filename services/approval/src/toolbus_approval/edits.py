"""An edited input checked against its tool's input schema before a decision sends it: the same
draft and rules as the dispatcher's check (`toolbus_dispatcher.validation`), nothing fetched."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Protocol

import jsonschema
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from jsonschema.protocols import Validator
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable
from toolbus_contracts.base import SCHEMA_DEPTH_MAX, nesting_depth
from toolbus_contracts.errors import InvalidRequest


def _never_fetch(uri: str) -> Any:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # attrs-made __init__, unseen by mypy


NO_RETRIEVAL: Registry[Any] = Registry(retrieve=_never_fetch)  # type: ignore[call-arg]  # attrs __init__


class Schemas(Protocol):
    """Where a tool's input schema comes from (the toolsets object store)."""

    async def input_schema(self, toolset_id: str, tool: str) -> dict[str, Any] | None:
        """The tool's pinned input schema, or None when the toolset or tool is unknown."""


def _path(error: ValidationError) -> str:
    path = "$"
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    if error.validator == "required" and isinstance(error.instance, dict):
        required: Any = error.validator_value
        missing = [p for p in required if p not in error.instance]
        if missing:
            path += f".{missing[0]}"
    return path


class EditCheck:
    """Checks edited inputs; validators compiled once per (toolset, tool): pinned schemas never change."""

    def __init__(self, schemas: Schemas, size: int = 1024) -> None:
        self._schemas = schemas
        self._cache: OrderedDict[tuple[str, str], Validator | None] = OrderedDict()
        self._size = size

    async def check(self, toolset_id: str, tool: str, edited: dict[str, Any]) -> None:
        """Raise `invalidRequest` naming `input` (and the failing path) when `edited` is not an
        input the tool accepts."""
        key = (toolset_id, tool)
        if key in self._cache:
            validator = self._cache[key]
        else:
            schema = await self._schemas.input_schema(toolset_id, tool)
            if schema is None:
                raise InvalidRequest(
                    f"Field 'input' cannot be checked: tool '{tool}' of toolset '{toolset_id}' is not "
                    "stored any more; approve without an edit or deny.",
                    details={"field": "input"},
                )
            validator = self._cache[key] = _compile(schema)
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        if validator is None:
            return
        try:
            error = best_match(validator.iter_errors(edited))
        except RecursionError:
            raise InvalidRequest(
                "Field 'input' nests too deep to be checked against the tool's schema.",
                details={"field": "input"},
            ) from None
        except Unresolvable as exc:
            ref = str(getattr(exc, "ref", "")) or "a reference"
            raise InvalidRequest(
                f"Field 'input' cannot be checked: the tool's schema refers to '{ref[:200]}', which is not in it.",
                details={"field": "input"},
            ) from None
        if error is not None:
            path = _path(error)
            raise InvalidRequest(
                f"Field 'input' is invalid at '{path}' for '{tool}': {error.message[:300]}.",
                details={"field": "input", "path": path},
            )


def _compile(schema: dict[str, Any]) -> Validator | None:
    """A validator, or None for a schema the dispatcher does not enforce either."""
    if nesting_depth(schema) > SCHEMA_DEPTH_MAX:
        return None
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError:
        return None
    validator: Validator = cls(schema, format_checker=cls.FORMAT_CHECKER, registry=NO_RETRIEVAL)
    return validator
