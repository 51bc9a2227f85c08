"""Where tool embeddings persist, keyed by model and text hash, so that no text is embedded twice:
not by a toolset registered again, not after a registry restart, not by a second replica.

`VectorStore` is what the embedding pipeline needs (batched, async); `KvVectorStore` keeps each
vector in a JetStream key-value bucket (`<model>.<blake2b-128 of the text>` -> float16 bytes,
768 bytes for 384 dimensions); `FileVectorStore` keeps them in one `.npz` file (for tests and
benches that must not embed a corpus on every run).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
from nats.js.errors import KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from toolbus_registry.search.encoder import Vectors

GET_CONCURRENCY = 64
"""KV reads in flight at once when a toolset's vectors are loaded (1,000 keys: ~16 round trips)."""


def text_key(text: str) -> str:
    """The content hash of an embedded text, as 32 hex digits."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


class VectorStore(Protocol):
    """Vectors of one model by text key; a missing key is simply absent from `get_many`."""

    async def get_many(self, keys: Sequence[str]) -> dict[str, Vectors]: ...

    async def put_many(self, vectors: Mapping[str, Vectors]) -> None: ...


def as_stored(vectors: Vectors) -> Vectors:
    """`vectors` rounded to what a store keeps (float16), as float32: a vector the registry has
    just encoded ranks exactly as the one a restarted registry or another replica reads back."""
    rounded: Vectors = vectors.astype(np.float16).astype(np.float32)
    return rounded


def _encode(vector: Vectors) -> bytes:
    return vector.astype(np.float16).tobytes()


def _decode(data: bytes) -> Vectors:
    vector: Vectors = np.frombuffer(data, dtype=np.float16).astype(np.float32)
    return vector


class KvVectorStore:
    """Vectors in a JetStream KV bucket shared by every replica; keys are prefixed by the model id
    so two models never mix."""

    def __init__(self, kv: KeyValue, model_id: str) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", model_id):
            raise ValueError(f"model id {model_id!r} is not a KV key token")
        self._kv = kv
        self._model = model_id

    async def get_many(self, keys: Sequence[str]) -> dict[str, Vectors]:
        limit = asyncio.Semaphore(GET_CONCURRENCY)
        found: dict[str, Vectors] = {}

        async def one(key: str) -> None:
            async with limit:
                try:
                    entry = await self._kv.get(f"{self._model}.{key}")
                except (KeyNotFoundError, NotFoundError):
                    return
            if entry.value:
                found[key] = _decode(entry.value)

        await asyncio.gather(*(one(k) for k in dict.fromkeys(keys)))
        return found

    async def put_many(self, vectors: Mapping[str, Vectors]) -> None:
        limit = asyncio.Semaphore(GET_CONCURRENCY)

        async def one(key: str, vector: Vectors) -> None:
            async with limit:
                await self._kv.put(f"{self._model}.{key}", _encode(vector))

        await asyncio.gather(*(one(k, v) for k, v in vectors.items()))


class FileVectorStore:
    """Vectors in one `.npz` file (keys and float16 rows), read once and rewritten on each put.
    For tests and benches: a registry uses `KvVectorStore`."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._vectors: dict[str, Vectors] | None = None

    def _load(self) -> dict[str, Vectors]:
        if self._vectors is None:
            self._vectors = {}
            if self._path.exists():
                with np.load(self._path) as data:
                    for key, row in zip(data["keys"].tolist(), data["vectors"], strict=True):
                        self._vectors[str(key)] = row.astype(np.float32)
        return self._vectors

    async def get_many(self, keys: Sequence[str]) -> dict[str, Vectors]:
        with self._lock:
            loaded = self._load()
            return {k: loaded[k] for k in keys if k in loaded}

    async def put_many(self, vectors: Mapping[str, Vectors]) -> None:
        if not vectors:
            return
        with self._lock:
            loaded = self._load()
            loaded.update(vectors)
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._path.with_name(self._path.name + ".tmp.npz")
            np.savez(
                tmp,
                keys=np.asarray(list(loaded), dtype="U32"),
                vectors=np.stack(list(loaded.values())).astype(np.float16),
            )
            tmp.replace(self._path)
