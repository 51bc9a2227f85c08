"""A registration tokenises each server's tools for the search index as its listing is pinned
(`server_fields`); the index built from those prepared fields is the one built from scratch:
same postings, texts and hits."""

from __future__ import annotations

import numpy as np
from toolbus_common.toolsets import StoredToolset
from toolbus_contracts import PinnedServer, PinnedToolset
from toolbus_registry.search import SearchIndex
from toolbus_registry.searching import SEARCH_OPTIONS, server_fields

from tests.support.mcp_servers import echo_tools, synthetic_tools


def servers() -> list[PinnedServer]:
    out = []
    for i, name in enumerate(("b-srv", "b", "a.x", "zeta")):
        tools = synthetic_tools(40, prefix=f"s{i}") + echo_tools()
        tools[0]["title"], tools[0]["description"] = "Titled only", None
        out.append(
            PinnedServer.model_validate(
                {"name": name, "url": f"http://127.0.0.1:{9000 + i}/mcp", "tools": tools}, by_alias=True
            )
        )
    return out


def test_an_index_from_prepared_fields_is_the_index_built_from_scratch() -> None:
    pinned = PinnedToolset(servers=servers())
    infos = StoredToolset("ts_x", pinned).table.infos()
    prepared = {}
    for server in pinned.servers[:-1]:  # the last one's tools are tokenised by the build itself
        prepared.update(server_fields(server))
    assert len(prepared) < len(infos)
    fresh = SearchIndex.build(infos, SEARCH_OPTIONS)
    built = SearchIndex.build(infos, SEARCH_OPTIONS, prepared)
    assert built.texts == fresh.texts and built.name_texts == fresh.name_texts
    postings, want = built._lexical._postings, fresh._lexical._postings
    assert list(postings) == list(want)
    for term, (ids, contrib) in want.items():
        assert np.array_equal(postings[term][0], ids) and np.array_equal(postings[term][1], contrib), term
    for query in ("echo the text back", "titled", "op 7 s1", "zeta"):
        assert built.search(query, 10) == fresh.search(query, 10)
