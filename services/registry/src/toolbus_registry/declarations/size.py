"""A floor on the size of a toolset's declarations, known without rendering them."""

from __future__ import annotations

from collections.abc import Iterable

_PER_TOOL = 26
"""Characters every tool adds whatever its schemas: its prompt line's `(`, `) -> `, result and
newline, and its dts signature's `(input: `, `): Promise<` and `>`."""


def declarations_floor(tools: Iterable[tuple[str, str]]) -> int:
    """At most the JSON size of `{"prompt": ..., "dts": ...}` for tools of these qualified names
    and descriptions (as `(name, description)` pairs): each tool's name
    (which opens its prompt line) and its description's non-space characters (all of which its dts
    JSDoc keeps) are counted once. A create reply whose tools and this floor already exceed the
    message budget is paged without rendering anything."""
    return sum(len(name) + _PER_TOOL + len("".join(description.split())) for name, description in tools)
