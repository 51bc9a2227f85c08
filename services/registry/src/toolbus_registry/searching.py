"""Glue between the registry and the search package: one index per content-addressed toolset
(an id never changes content), its tools embedded in the background, hits with their prompt line
and dts fragment.

A toolset is searchable lexically as soon as its index is built (milliseconds); its vectors come
from the `Embedder` (memory, then the persisted store, then the model) in a background task
started when it is registered or first searched. A search never waits for that task: until the
vectors are attached it answers from the lexical ranking alone.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np
import numpy.typing as npt
from nats.js import JetStreamContext
from prometheus_client import Counter, Gauge
from toolbus_common.connections import DEFAULT_PLACEMENT, JsPlacement, ensure_kv
from toolbus_common.in_flight import InFlight
from toolbus_common.lru import Lru
from toolbus_common.toolsets import StoredToolset, mcp_tool_description, mcp_tool_name
from toolbus_contracts import PinnedServer, ToolsetSearchReply
from toolbus_contracts.registry import SearchRanking

from toolbus_registry.declarations import tool_dts_fragment, tool_prompt_line
from toolbus_registry.search import (
    Embedder,
    KvVectorStore,
    PreparedTerms,
    SearchIndex,
    default_encoder,
    to_hits,
)
from toolbus_registry.search.encoder import MODEL_ID

log = logging.getLogger("toolbus.registry.search")

INDEX_CACHE_TOOLS = 20_000
"""Tools, summed over toolsets, whose built indexes (with their vectors: 1.5 KiB a tool) are kept
in memory; the least recently searched toolset goes first."""
EMBEDDER_MEMORY = 10_000
"""Tool vectors the embedder keeps in memory (for toolsets sharing tools), each as its own float16
copy: at most 7.7 MiB at 384 dimensions (768 bytes and ~40 of `bytes` object a vector)."""

TEXTS_ENCODED = Counter("toolbus_search_texts_encoded_total", "Tool texts run through the embedding model.")
TEXTS_LOADED = Counter(
    "toolbus_search_texts_loaded_total", "Tool texts whose vectors were read from the persisted store."
)
PREPARED_TOOLSETS = 8
"""Registrations whose prepared search terms wait for their index build (normally one, built
right after its reply)."""
SEARCHES_FIRST = 0.5
"""Seconds background work (a toolset's embedding, its declarations' rendering) waits, at most,
for the searches being answered: on two cores a search right after a registration otherwise
shares the interpreter with loading the model and rendering (docs/design.md)."""

EMBED_CHUNK_TOOLS = 128
"""Tools embedded and attached at a time in the background (their vectors used by searches at
once, and counted in `toolsets.get`'s `vectors`)."""
ON_DEMAND_TOOLS = 15
"""The lexical head of a search embedded on demand while the toolset is not wholly embedded.
The agent's queries sent one after another on a fresh index rank with a head of 15 as with 20 or
50 (Twilio 0.921 / 0.983 unscoped, 0.961 / 0.994 scoped; Kubernetes 0.967 / 0.992, 0.975 / 1.000;
a head of 10 or 12 lost a task or two), at 3/4 of the encoding a search waits for."""
ON_DEMAND_WAIT = 1.5
"""Seconds a search waits, at most, for its head to be embedded; past that it answers lexically
(`ranking: lexical`) and the head is attached when done."""
ON_DEMAND = Counter(
    "toolbus_search_tools_embedded_on_demand_total", "Tools embedded for a search before their turn."
)
EMBEDDING = Gauge("toolbus_search_toolsets_embedding", "Toolsets whose tools are being embedded now.")


@cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def release_freed_memory() -> None:
    """Hand the heap pages freed by an embedding back to the OS (glibc's `malloc_trim`; a no-op
    elsewhere). The encoder's activations are freed after each batch but glibc keeps their pages
    in the worker threads' arenas: measured ~10 MiB of RSS given back after 400 texts."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is not None:
        trim(0)


def _log_failure(future: asyncio.Future[None]) -> None:
    """A terms-preparing job's end: a failure only leaves the build more to do (it is logged)."""
    if not future.cancelled() and future.exception() is not None:
        log.warning("preparing search terms failed", exc_info=future.exception())


class Searcher:
    """Search indexes by toolset id with their background embedding. Runs on the event loop;
    CPU-bound work goes to worker threads."""

    def __init__(self, embedder: Embedder | None = None, cache_tools: int = INDEX_CACHE_TOOLS) -> None:
        self.embedder = embedder or Embedder(default_encoder, max_entries=EMBEDDER_MEMORY)
        self._indexes: Lru[str, SearchIndex] = Lru(cache_tools, weight=lambda _, index: max(len(index), 1))
        self._building: dict[str, asyncio.Future[SearchIndex]] = {}
        self._embedding: dict[str, asyncio.Task[None]] = {}
        self._prepared: Lru[str, PreparedTerms] = Lru(PREPARED_TOOLSETS)
        self._preparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="search-terms")
        """Its own thread: a registration's prepare jobs never hold up a search or a build."""
        self._searches = InFlight()

    def preparing(self, prepared: PreparedTerms) -> Callable[[PinnedServer], None]:
        """For a registration (`Pinner.pin`'s `on_pinned`): each server pinned afresh has its
        tools' search terms worked out into `prepared` in a worker thread, while other servers
        are still being listed; `prepared_for` then hands them to the toolset's index build."""
        loop = asyncio.get_running_loop()

        def on_pinned(server: PinnedServer) -> None:
            tools = [
                (mcp_tool_name(server.name, t.name), mcp_tool_description(t), t.input_schema)
                for t in server.tools
            ]
            try:
                job = loop.run_in_executor(self._preparer, prepared.add, tools)
            except RuntimeError:  # the executor is shut down: the build does it all
                return
            job.add_done_callback(_log_failure)

        return on_pinned

    async def load_model(self) -> None:
        """Load the embedding model (once, in a worker thread). The registry does it before it
        serves, so no registration or search shares the interpreter with the load (0.3-1 s of
        CPU). A failure is logged: searches rank lexically meanwhile, and the next one that needs
        the model tries again."""
        try:
            await self.embedder.load()
        except Exception:
            log.exception("loading the embedding model failed")
        await asyncio.to_thread(release_freed_memory)  # the weights read and quantized: ~16 MiB

    def prepared_for(self, toolset_id: str, prepared: PreparedTerms) -> None:
        """The listing is over and `prepared` closed (nothing more is added, so the store write and
        the reply do not share the interpreter with it): what it holds of this toolset's tools'
        terms is what its index build (after the reply, or a first search's) starts from."""
        if toolset_id not in self._indexes and toolset_id not in self._building and prepared.known:
            self._prepared.put(toolset_id, prepared)

    def holds(self, toolset_id: str) -> bool:
        """Whether the toolset's index is in memory (built, and not yet dropped from the cache)."""
        return toolset_id in self._indexes

    async def index(self, stored: StoredToolset) -> SearchIndex:
        """The toolset's index, built once (in a thread) however many ask at the same time."""
        index = self._indexes.get(stored.id)
        if index is not None:
            return index
        pending = self._building.get(stored.id)
        if pending is None:
            prepared = self._prepared.pop(stored.id)
            pending = asyncio.ensure_future(
                asyncio.to_thread(SearchIndex.build, stored.table.infos(), None, prepared)
            )
            self._building[stored.id] = pending
            try:
                index = await pending
            finally:
                self._building.pop(stored.id, None)
            self._indexes.put(stored.id, index)
            return index
        return await asyncio.shield(pending)

    async def warm(self, stored: StoredToolset) -> None:
        """Build the index now and start embedding its tools (not waiting for that)."""
        self._start_embedding(stored.id, await self.index(stored))

    def _start_embedding(self, toolset_id: str, index: SearchIndex) -> None:
        if index.dense or toolset_id in self._embedding:
            return
        task = asyncio.create_task(self._embed(toolset_id, index))
        self._embedding[toolset_id] = task
        task.add_done_callback(lambda _: self._embedding.pop(toolset_id, None))

    async def after_searches(self, within: float = SEARCHES_FIRST) -> None:
        """Until no search is being answered, at most `within` seconds: background work waits
        for the searches under way (the first after a registration waits for its index)."""
        await self._searches.idle(within, asyncio.get_running_loop())

    async def _embed(self, toolset_id: str, index: SearchIndex) -> None:
        await self.after_searches()
        EMBEDDING.inc()
        encoded, loaded = self.embedder.encoded, self.embedder.loaded
        try:
            # Chunk by chunk, each attached as it is done: searches meanwhile rank with the
            # vectors there are (and `vectors` shows the progress), not lexically alone.
            n = len(index)
            for start in range(0, n, EMBED_CHUNK_TOOLS):
                ids = np.arange(start, min(start + EMBED_CHUNK_TOOLS, n), dtype=np.intp)
                ids = index.missing(ids)
                if ids.size:
                    index.attach_some(ids, await self.embedder.embed(index.texts_of(ids)))
            index.attach(await self.embedder.embed(index.embedding_texts))
        except Exception:
            # Search stays lexical for this toolset; the next search or registration tries again.
            log.exception("embedding toolset %s failed", toolset_id)
        finally:
            if self.embedder.encoded > encoded:
                await asyncio.to_thread(release_freed_memory)
            EMBEDDING.dec()
            TEXTS_ENCODED.inc(self.embedder.encoded - encoded)
            TEXTS_LOADED.inc(self.embedder.loaded - loaded)

    async def close(self) -> None:
        """Stop the background embeddings (a chunk being encoded finishes in its thread)."""
        tasks = list(self._embedding.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def wait_embedded(self, toolset_id: str) -> None:
        """Until the toolset's background embedding (if one runs) has finished."""
        task = self._embedding.get(toolset_id)
        if task is not None:
            await asyncio.shield(task)

    def embedding(self, toolset_id: str) -> bool:
        """Whether the toolset's tools are being embedded now."""
        return toolset_id in self._embedding

    def dense(self, toolset_id: str) -> bool:
        """Whether the toolset's searches rank by its vectors (they are attached)."""
        index = self._indexes.get(toolset_id)
        return index is not None and index.dense

    async def search(
        self, stored: StoredToolset, query: str, limit: int, namespaces: Sequence[str] | None = None
    ) -> ToolsetSearchReply:
        """The best `limit` tools for `query`, of `namespaces` only when given (names the caller
        checked: an unknown one adds no tool). Until every tool of the toolset is embedded, the
        query's lexical head (`ON_DEMAND_TOOLS`) is embedded first (at once, not behind the
        background embedding; waited for `ON_DEMAND_WAIT` at most) and the search ranks with the
        vectors there are: `ranking` is `partial` then, `lexical` where the head's vectors (or the
        model, still loading) could not be had in time."""
        self._searches.enter()
        try:
            index = await self.index(stored)
            within = index.within(namespaces) if namespaces is not None else None
            vectors = await self._model_loaded()
            if vectors and not index.dense:
                vectors = await self._embed_head(stored.id, index, query, within)
            reply = await asyncio.to_thread(self._search, index, query, limit, within, vectors)
        finally:
            self._searches.leave()
        if not index.dense:
            self._start_embedding(stored.id, index)
        return reply

    async def _model_loaded(self) -> bool:
        """Whether the model is loaded, waiting `ON_DEMAND_WAIT` at most for a load under way (the
        registry loads it before it serves; this is a load tried again after a failure)."""
        loading = self.embedder.load()
        if not loading.done():
            try:
                await asyncio.wait_for(asyncio.shield(loading), ON_DEMAND_WAIT)
            except TimeoutError:
                return False
        return not loading.cancelled() and loading.exception() is None

    async def _embed_head(
        self, toolset_id: str, index: SearchIndex, query: str, within: npt.NDArray[np.intp] | None
    ) -> bool:
        """Embed the tools of the query's lexical head that have no vectors yet; whether the
        search can rank with vectors (False when embedding failed: it stays lexical)."""
        head = await asyncio.to_thread(index.lexical_top, query, ON_DEMAND_TOOLS, within)
        missing = index.missing(head)
        if missing.size:
            job = asyncio.ensure_future(self._attach_head(toolset_id, index, missing))
            try:
                # Not done by then (the model still loading, a busy machine): this search is
                # answered lexically; the head is attached when it is done, for the next one.
                if not await asyncio.wait_for(asyncio.shield(job), ON_DEMAND_WAIT):
                    return False
            except TimeoutError:
                return False
        return index.embedded > 0

    async def _attach_head(self, toolset_id: str, index: SearchIndex, ids: npt.NDArray[np.intp]) -> bool:
        try:
            vectors = await self.embedder.embed(index.texts_of(ids), foreground=True)
        except Exception:
            log.exception("embedding the head of a search of toolset %s failed", toolset_id)
            return False
        index.attach_some(ids, vectors)
        ON_DEMAND.inc(int(ids.size))
        return True

    def _search(
        self,
        index: SearchIndex,
        query: str,
        limit: int,
        within: npt.NDArray[np.intp] | None,
        vectors: bool,
    ) -> ToolsetSearchReply:
        dense = index.dense
        vector = self.embedder.encode_query(query) if vectors else None
        hits = index.search(query, limit, query_vector=vector, within=within)
        ranking: SearchRanking = "lexical" if vector is None else "hybrid" if dense else "partial"
        return ToolsetSearchReply(tools=to_hits(hits, tool_prompt_line, tool_dts_fragment), ranking=ranking)

    def vectors(self, toolset_id: str) -> tuple[int, int] | None:
        """(tools embedded, tools) of a toolset whose index is in memory, else None."""
        index = self._indexes.get(toolset_id)
        return (index.embedded, len(index)) if index is not None else None


async def open_searcher(
    js: JetStreamContext, bucket: str, *, placement: JsPlacement = DEFAULT_PLACEMENT
) -> Searcher:
    """A searcher whose vectors persist in the JetStream KV bucket `bucket` (shared by replicas)."""
    store = KvVectorStore(await ensure_kv(js, bucket, placement=placement), MODEL_ID)
    return Searcher(Embedder(default_encoder, store, max_entries=EMBEDDER_MEMORY))
