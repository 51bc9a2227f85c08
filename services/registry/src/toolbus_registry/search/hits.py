"""Search results as the contract's `SearchHit`s: each tool with its prompt line and its own
declaration fragment, from the declarations functions the caller passes in."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from toolbus_contracts import ToolInfo
from toolbus_contracts.registry import SearchHit

from toolbus_registry.search.index import ScoredTool, scope_name


def to_hits(
    results: Iterable[ScoredTool],
    prompt_line: Callable[[ToolInfo], str],
    dts_fragment: Callable[[ToolInfo], str],
) -> list[SearchHit]:
    """`SearchHit`s in the order given; scores rounded to 4 decimals (more is noise)."""
    return [
        SearchHit(
            name=r.tool.name,
            namespace=scope_name(r.tool.name),
            prompt=prompt_line(r.tool),
            dts=dts_fragment(r.tool),
            score=round(r.score, 4),
        )
        for r in results
    ]
