"""Tool-text embeddings cached by content hash, shared by every index of the process.

Two toolsets that hold the same tool (same embedding text) share its vector, and a toolset built
again after eviction costs nothing to re-embed while its tools are still cached. Bounded LRU,
thread-safe.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

from toolbus_registry.search.encoder import Encoder, Vectors


def content_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


class EmbeddingCache:
    """Embeddings of texts by content hash, at most `max_entries` kept (least recently used go)."""

    def __init__(self, encoder: Callable[[], Encoder], max_entries: int = 50_000) -> None:
        self._encoder = encoder
        self._max = max_entries
        self._vectors: OrderedDict[bytes, Vectors] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._vectors)

    def embed(self, texts: Sequence[str]) -> Vectors:
        """Unit vectors of the texts, shape (len(texts), dim); only the uncached ones are encoded."""
        keys = [content_key(t) for t in texts]
        found: dict[bytes, Vectors] = {}
        with self._lock:
            for k in keys:
                v = self._vectors.get(k)
                if v is not None:
                    self._vectors.move_to_end(k)
                    found[k] = v
        missing: dict[bytes, str] = {}
        for k, t in zip(keys, texts, strict=True):
            if k not in found:
                missing.setdefault(k, t)
        encoder = self._encoder()
        if missing:
            fresh = encoder.encode(list(missing.values()))
            with self._lock:
                for k, v in zip(missing, fresh, strict=True):
                    found[k] = v
                    self._vectors[k] = v
                    self._vectors.move_to_end(k)
                while len(self._vectors) > self._max:
                    self._vectors.popitem(last=False)
        if not keys:
            return np.zeros((0, encoder.dim), dtype=np.float32)
        return np.stack([found[k] for k in keys])
