"""Who may see and decide which approvals: a person's groups map to grants of toolsets and
namespaces (`TOOLBUS_CONSOLE_GROUPS`); one grant that covers an approval is enough."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ANY = "*"


@dataclass(frozen=True, slots=True)
class Grant:
    """Approvals of these toolsets in these namespaces; None: any. An approval without a
    namespace matches a grant of namespaces only when it lists `""`."""

    toolsets: frozenset[str] | None = None
    namespaces: frozenset[str] | None = None

    def covers(self, toolset_id: str | None, namespace: str | None) -> bool:
        if self.toolsets is not None and (toolset_id is None or toolset_id not in self.toolsets):
            return False
        return self.namespaces is None or (namespace or "") in self.namespaces

    @property
    def any_toolset(self) -> bool:
        return self.toolsets is None


EVERYTHING = Grant()


def _names(value: Any, where: str) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"TOOLBUS_CONSOLE_GROUPS: {where} must be a list of strings")
    return None if ANY in value else frozenset(value)


def _grant(value: Any, group: str) -> Grant:
    if value == ANY:
        return EVERYTHING
    if not isinstance(value, dict) or not set(value) <= {"toolsets", "namespaces"}:
        raise ValueError(
            f'TOOLBUS_CONSOLE_GROUPS: group {group!r} must map to "*" or to '
            '{"toolsets": [...], "namespaces": [...]} (or a list of those)'
        )
    return Grant(
        _names(value.get("toolsets"), f"{group}.toolsets"),
        _names(value.get("namespaces"), f"{group}.namespaces"),
    )


class Grants:
    """The deployment's group map, parsed once at start (a malformed one stops the start)."""

    def __init__(self, groups: Mapping[str, Any]) -> None:
        self._by_group: dict[str, tuple[Grant, ...]] = {}
        for group, value in groups.items():
            values = value if isinstance(value, list) else [value]
            self._by_group[group] = tuple(_grant(v, group) for v in values)

    def of(self, groups: Iterable[str]) -> tuple[Grant, ...]:
        """Every grant the groups give (none: the person sees nothing)."""
        return tuple(g for group in groups for g in self._by_group.get(group, ()))


@dataclass(frozen=True, slots=True)
class Person:
    """A signed-in person: the decider name their decisions carry and what they may decide."""

    subject: str
    name: str
    groups: tuple[str, ...]
    grants: tuple[Grant, ...]

    @property
    def decider(self) -> str:
        return f"console:{self.subject}"

    def may(self, toolset_id: str | None, namespace: str | None) -> bool:
        """May see and decide an approval of this toolset and namespace."""
        return any(g.covers(toolset_id, namespace) for g in self.grants)

    def namespaces(self) -> frozenset[str] | None:
        """The namespaces the person's grants name, when every grant names some (and none is the
        "no namespace" `""`); None when a grant covers any namespace."""
        names: set[str] = set()
        for grant in self.grants:
            if grant.namespaces is None or "" in grant.namespaces:
                return None
            names |= grant.namespaces
        return frozenset(names)

    def may_remembered(self, namespace: str | None) -> bool:
        """May see and revoke a remembered decision (it names a namespace and tool, no toolset):
        only with a grant of any toolset covering its namespace."""
        return any(g.any_toolset and g.covers(None, namespace) for g in self.grants)
