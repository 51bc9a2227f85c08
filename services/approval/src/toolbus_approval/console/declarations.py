"""A tool's declaration line, as the registry renders it for a model (`toolsets.declarations`,
format `prompt`, the tool's namespace only), asked once per toolset and tool and kept."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from toolbus_common.lru import Lru
from toolbus_contracts import Subjects

log = logging.getLogger(__name__)


class Declarations:
    """`line(toolset_id, tool)`: the registry's one-line declaration, or None when the registry
    does not answer (the page shows the approval without it)."""

    def __init__(self, nc: Any, subjects: Subjects, size: int = 512) -> None:
        self._nc = nc
        self._subjects = subjects
        self._lines: Lru[tuple[str, str], str] = Lru(size)
        """The line, or "" when the registry has none for the tool."""

    async def line(self, toolset_id: str, tool: str) -> str | None:
        key = (toolset_id, tool)
        known = self._lines.get(key)
        if known is not None:
            return known or None
        namespace = tool.split(".", 1)[0]
        body = {"id": toolset_id, "format": "prompt", "namespace": namespace}
        try:
            msg = await self._nc.request(self._subjects.toolsets_declarations, orjson.dumps(body), timeout=3)
            reply = orjson.loads(msg.data)
        except Exception as exc:
            log.info("console: no declaration from the registry", extra={"error": type(exc).__name__})
            return None
        found = ""
        if reply.get("ok"):
            for text in str(reply["data"].get("text", "")).splitlines():
                if text.strip().startswith(f"{tool}("):
                    found = text.strip()
                    break
        self._lines.put(key, found)
        return found or None
