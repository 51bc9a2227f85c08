"""What every executor takes and raises.

An executor runs one attempt and returns the tool's output, or raises:
- `Interrupted`: the contract's interruption (connection lost before an answer, 502/503/504, a
  missed heartbeat...); `sent=False` when the request provably never left, so it may be sent
  again even under `at_most_once`;
- `NeedsCredentials`: the MCP server answered 401; the call is parked, not failed;
- any other `ToolbusError`: the call's final error outcome (tool error, 4xx, host not allowed...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from toolbus_common.toolsets import Tool
from toolbus_contracts import ToolbusError
from toolbus_contracts.credentials import CredentialLevel
from toolbus_mcp_client import Reserve

from toolbus_dispatcher.records import CallRecord


class Interrupted(Exception):
    """The attempt got no answer that can be trusted; `error` is what the call ends with if no
    further attempt is made."""

    def __init__(self, error: ToolbusError, *, sent: bool = True) -> None:
        super().__init__(error.message)
        self.error = error
        self.sent = sent


class NeedsCredentials(Exception):
    """The server `server` rejected the credentials of `level` with a 401 (or a 403 asking for
    a larger scope: `scopes` are those its challenge named)."""

    def __init__(
        self,
        server: str,
        level: CredentialLevel,
        version: int | None = None,
        scopes: tuple[str, ...] | None = None,
    ) -> None:
        super().__init__(f"server '{server}' rejected the {level} credentials")
        self.server = server
        self.level = level
        self.version = version
        """The credentials version the rejected headers were resolved at (None: unknown)."""
        self.scopes = scopes
        """A step-up: the scopes the server's `insufficient_scope` challenge asked for (maybe
        none); None for a 401."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of one call: the stored call, the pinned tool, the attempt number (from 1)."""

    call: CallRecord
    tool: Tool
    number: int
    input: dict[str, Any]
    timeout: float | None
    http_allow: tuple[str, ...] = ()
    """The toolset's http allow-list (the http tool only)."""
    workflow_version: str | None = None
    reserve: Reserve | None = field(default=None, compare=False)
    """Awaited with an answer's size before a large answer is read on (`output_memory`)."""
    progress: Progress = field(default_factory=lambda: Progress(), compare=False)
    """Where the attempt is: an executor marks the steps before anything is sent, so an attempt
    that times out there is known not to have been sent."""


class Progress:
    """`sending` is False while an executor is still preparing (e.g. resolving credentials): a
    timeout then interrupts an attempt that provably sent nothing."""

    __slots__ = ("sending",)

    def __init__(self) -> None:
        self.sending = True


class Executor(Protocol):
    async def execute(self, attempt: Attempt) -> Any:
        """Run the attempt; return the call's output or raise (see the module doc)."""
        ...
