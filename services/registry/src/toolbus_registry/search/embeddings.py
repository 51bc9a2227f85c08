"""Tool-text embeddings: from memory, else from the persisted store, else encoded (and stored).

`Embedder.embed(texts)` is async: store reads and writes run on the event loop, encoding runs in
a worker thread. Texts are keyed by content hash, so a tool shared by two toolsets, a toolset
registered again, a restarted registry and a second replica all reuse the same vectors;
`encoded` counts the texts this process actually ran through the model. Bounded LRU in memory.
A freshly encoded vector is rounded to the store's float16 before it is used (`as_stored`), so
the registry that embedded a toolset ranks exactly as a restarted one or a second replica does.
The memory keeps each vector as those float16 bytes, a copy of its own (768 bytes at 384
dimensions), so its bound is one on bytes: it holds no row of an array an index let go of.

The background encoding runs in one worker thread of its own at a lower scheduling priority
(`BACKGROUND_NICE`), so a 1,000-tool embedding (several seconds of CPU) yields the cores to what
answers requests (registrations, calls, the MCP servers being listed) instead of sharing them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from toolbus_common.lru import Lru

from toolbus_registry.search.encoder import Encoder, Vectors
from toolbus_registry.search.store import VectorStore, as_stored, text_key

ENCODE_BATCH = 8
"""Texts per forward pass: less memory than 32 (peak RSS 271 against 333 MiB on 256 tool texts,
numpy encoder) and less CPU on onnxruntime (40 texts: 66 ms at 8, 177 ms at 40: less padding)."""
ENCODE_CHUNK = 64
"""Texts encoded per worker-thread call: between chunks the GIL is free for the event loop (a
search during a background embedding answers in milliseconds, not after the whole toolset)."""
BACKGROUND_NICE = 10
"""Added to the nice value of the thread that encodes tool texts in the background (Linux applies
nice per thread; elsewhere, or where it is refused, the thread keeps the process's priority).
Measured on the shared 2-core machine (bench/registry.py, registrations while the previous one's
1,030 tools were being embedded): see docs/design.md. Queries (`encode_query`) keep the normal
priority: a search is foreground work."""


def _lower_priority() -> None:
    """Worker-thread initializer: lower this thread's priority by `BACKGROUND_NICE`."""
    with contextlib.suppress(OSError, AttributeError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICE)


def _from_halves(rows: Sequence[bytes]) -> Vectors:
    """float32 vectors, one per row, from the float16 bytes the memory keeps."""
    halves = np.frombuffer(b"".join(rows), dtype=np.float16).reshape(len(rows), -1)
    vectors: Vectors = halves.astype(np.float32)
    return vectors


class Embedder:
    """Embeddings of texts of one model, shared by every index of a registry process."""

    def __init__(
        self,
        encoder: Callable[[], Encoder],
        store: VectorStore | None = None,
        max_entries: int = 50_000,
    ) -> None:
        self._encoder = encoder
        self._store = store
        self._memory: Lru[str, bytes] = Lru(max_entries)
        """Text key -> the vector's float16 bytes (exact: vectors are rounded to float16)."""
        self._lock = threading.Lock()
        self._background = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="toolbus-embed", initializer=_lower_priority
        )
        self.encoded = 0
        """Texts encoded by the model in this process (the rest came from memory or the store)."""
        self.loaded = 0
        """Texts whose vectors came from the persisted store."""
        self._loading: asyncio.Future[Encoder] | None = None

    def load(self) -> asyncio.Future[Encoder]:
        """The model, loaded once in a worker thread (at the normal priority: searches need it
        too): a registration starts it, so the first search after it finds it loaded."""
        if self._loading is None or (self._loading.done() and self._loading.exception() is not None):
            self._loading = asyncio.ensure_future(asyncio.to_thread(self._encoder))
        return self._loading

    def cached(self, texts: Sequence[str]) -> Vectors | None:
        """The vectors of `texts` if every one is in memory, else None (no I/O, no encoding)."""
        rows = []
        for t in texts:
            v = self._memory.get(text_key(t))
            if v is None:
                return None
            rows.append(v)
        return _from_halves(rows) if rows else np.zeros((0, 0), dtype=np.float32)

    async def embed(self, texts: Sequence[str], *, foreground: bool = False) -> Vectors:
        """Unit vectors of `texts`, shape (len(texts), dim), in order. `foreground`: texts a
        search waits for, encoded at the normal priority (not behind the background queue)."""
        keys = [text_key(t) for t in texts]
        hits: dict[str, bytes] = {}
        for k in keys:
            half = self._memory.get(k)
            if half is not None:
                hits[k] = half
        found: dict[str, Vectors] = (
            dict(zip(hits, _from_halves(list(hits.values())), strict=True)) if hits else {}
        )
        missing = [k for k in dict.fromkeys(keys) if k not in found]
        if missing and self._store is not None:
            stored = await self._store.get_many(missing)
            self.loaded += len(stored)
            found.update(stored)
            missing = [k for k in missing if k not in found]
        if missing:
            loop = asyncio.get_running_loop()
            # Loaded at the normal priority: a niced load would hold the ~200 MiB peak of reading
            # and quantizing the weights for longer.
            await asyncio.shield(self.load())
            by_key = dict(zip(keys, texts, strict=True))
            fresh: dict[str, Vectors] = {}
            for start in range(0, len(missing), ENCODE_CHUNK):
                chunk = missing[start : start + ENCODE_CHUNK]
                batch = [by_key[k] for k in chunk]
                vectors = await (
                    asyncio.to_thread(self._encode, batch)
                    if foreground
                    else loop.run_in_executor(self._background, self._encode, batch)
                )
                fresh.update(zip(chunk, vectors, strict=True))
            found.update(fresh)
            if self._store is not None:
                await self._store.put_many(fresh)
        if not keys:
            return np.zeros((0, self._encoder().dim), dtype=np.float32)
        vectors = np.stack([found[k] for k in keys])
        vectors.flags.writeable = False  # attached to indexes, shared by their searches
        # Copies, not rows of `vectors`: a row would keep the whole array alive after the index
        # holding it was dropped, so a few texts shared with later toolsets could each keep a
        # toolset's array in memory. Half the size of the float32 rows (docs/design.md,
        # "Registry memory").
        for k, half in zip(keys, vectors.astype(np.float16), strict=True):
            self._memory.put(k, half.tobytes())
        return vectors

    async def settled(self) -> None:
        """Until the chunk of texts being encoded in the background (if one is) is done: after
        the embeddings are cancelled (`Searcher.close`), the thread finishes its chunk."""
        await asyncio.get_running_loop().run_in_executor(self._background, lambda: None)

    def _encode(self, texts: list[str]) -> Vectors:
        # Rounded as the store keeps them, so this process ranks with the vectors every replica
        # and every restart reads back, not with float32 ones of its own.
        vectors = as_stored(self._encoder().encode(texts, batch_size=ENCODE_BATCH))
        with self._lock:
            self.encoded += len(texts)
        return vectors

    def encode_query(self, query: str) -> Vectors:
        """The vector of a search query (synchronous: callers are already off the event loop)."""
        vector: Vectors = self._encoder().encode([query])[0]
        return vector
