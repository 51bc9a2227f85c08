"""Where an MCP call's credential headers come from.

The dispatcher asks a `CredentialResolver` for the headers of (toolset, namespace, run, server);
it answers the headers of the most specific level that has an entry for the server, and that level
(`toolset` when none has). `observe_version` is fed the credentials version counter that the
dispatcher reads in the script it runs for every call anyway, so a resolver can drop its cache the
moment credentials change without a round trip of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from toolbus_common.credential_store import CredentialStore
from toolbus_contracts.credentials import CredentialLevel


class CredentialResolver(Protocol):
    async def resolve(
        self, toolset_id: str, namespace: str | None, run_id: str, server: str
    ) -> tuple[Mapping[str, str], CredentialLevel]: ...

    def observe_version(self, version: str) -> None: ...

    def seen_version(self) -> int | None:
        """The version the next `resolve` answers at (at least as new), or None when unknown."""
        ...

    async def refresh(self) -> None:
        """Read the version counter now (before resending parked calls)."""
        ...

    async def delete_run(self, run_id: str) -> None:
        """Forget the run-level credentials of a closed run."""
        ...


class NoCredentials:
    """A resolver for deployments without a credentials store: no headers, level `toolset`."""

    async def resolve(
        self, toolset_id: str, namespace: str | None, run_id: str, server: str
    ) -> tuple[Mapping[str, str], CredentialLevel]:
        return {}, "toolset"

    def observe_version(self, version: str) -> None:
        return None

    def seen_version(self) -> int | None:
        return None

    async def refresh(self) -> None:
        return None

    async def delete_run(self, run_id: str) -> None:
        return None


class StaticCredentials:
    """In-memory credentials by (level, scope): for tests and embedding. Scope is the toolset id,
    `toolsetId/namespace`, or the run id."""

    def __init__(self) -> None:
        self.levels: dict[tuple[CredentialLevel, str], dict[str, dict[str, str]]] = {}
        self.version = ""

    def set(self, level: CredentialLevel, scope: str, servers: dict[str, dict[str, str]]) -> None:
        self.levels[(level, scope)] = servers

    async def resolve(
        self, toolset_id: str, namespace: str | None, run_id: str, server: str
    ) -> tuple[Mapping[str, str], CredentialLevel]:
        candidates: list[tuple[CredentialLevel, str]] = [("run", run_id)]
        if namespace:
            candidates.append(("namespace", f"{toolset_id}/{namespace}"))
        candidates.append(("toolset", toolset_id))
        for level, scope in candidates:
            headers = self.levels.get((level, scope), {}).get(server)
            if headers:
                return headers, level
        return {}, "toolset"

    def observe_version(self, version: str) -> None:
        self.version = version

    def seen_version(self) -> int | None:
        return None

    async def refresh(self) -> None:
        return None

    async def delete_run(self, run_id: str) -> None:
        self.levels.pop(("run", run_id), None)


class StoreCredentials:
    """Resolves through the credentials service's encrypted `CredentialStore`, served from its
    in-process cache while the version counter (seen in the per-call script) is unchanged."""

    MEMO_SIZE = 4096

    def __init__(self, store: CredentialStore) -> None:
        self._store = store
        self._version = 0
        self._memo: dict[tuple[str, str | None, str, str], tuple[Mapping[str, str], CredentialLevel]] = {}
        """Answers at `_memo_version`, by (toolset, namespace, run, server): the store's cache
        holds the documents, this the pick from them, so a repeated call is one dict lookup."""
        self._memo_version = 0

    async def resolve(
        self, toolset_id: str, namespace: str | None, run_id: str, server: str
    ) -> tuple[Mapping[str, str], CredentialLevel]:
        version = self._version
        key = (toolset_id, namespace, run_id, server)
        if self._memo_version != version:
            self._memo.clear()
            self._memo_version = version
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        found = await self._store.resolve(
            toolset_id=toolset_id, namespace=namespace, run_id=run_id, server=server, version=version
        )
        answer: tuple[Mapping[str, str], CredentialLevel] = (found.headers, found.level or "toolset")
        if self._memo_version == version:  # no newer version seen while Redis was read
            if len(self._memo) >= self.MEMO_SIZE:
                self._memo.clear()
            self._memo[key] = answer
        return answer

    def observe_version(self, version: str) -> None:
        try:
            value = int(version)
        except ValueError:
            return
        self._version = max(self._version, value)

    def seen_version(self) -> int | None:
        return self._version

    async def refresh(self) -> None:
        self._version = max(self._version, await self._store.version())

    async def delete_run(self, run_id: str) -> None:
        await self._store.delete_run(run_id)
