"""How the registry bounds its memory and keeps its background embedding in the background:
the embedding runs on one thread of its own at a lower priority (Linux), the loop's default
executor has `WORKER_THREADS` threads, and the malloc settings are accepted by glibc."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Sequence

import numpy as np
import pytest
from toolbus_registry.memory import WORKER_THREADS, bound_worker_threads
from toolbus_registry.search import Embedder
from toolbus_registry.search.embeddings import BACKGROUND_NICE, ENCODE_CHUNK
from toolbus_registry.search.encoder import Vectors


class RecordingEncoder:
    """Stands in for the model (what is tested is where encoding runs, not the vectors)."""

    dim = 4

    def __init__(self) -> None:
        self.threads: set[int] = set()
        self.nice: set[int] = set()

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> Vectors:
        tid = threading.get_native_id()
        self.threads.add(tid)
        self.nice.add(os.getpriority(os.PRIO_PROCESS, tid))
        return np.ones((len(texts), self.dim), dtype=np.float32)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="nice applies per thread on Linux")
async def test_background_embedding_runs_on_one_thread_of_lower_priority() -> None:
    encoder = RecordingEncoder()
    embedder = Embedder(lambda: encoder)  # type: ignore[arg-type,return-value]
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    texts = [f"tool {i}" for i in range(3 * ENCODE_CHUNK)]
    vectors = await embedder.embed(texts)
    assert vectors.shape == (len(texts), encoder.dim) and embedder.encoded == len(texts)
    assert len(encoder.threads) == 1 and threading.get_native_id() not in encoder.threads
    assert encoder.nice == {min(own + BACKGROUND_NICE, 19)}
    # the event loop's thread keeps its priority
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own


async def test_the_default_executor_has_a_bounded_number_of_threads() -> None:
    loop = asyncio.get_running_loop()
    bound_worker_threads(loop)
    seen: set[int] = set()
    gate = threading.Barrier(WORKER_THREADS, timeout=30)

    def work() -> None:
        seen.add(threading.get_ident())
        if len(seen) <= WORKER_THREADS:
            with contextlib.suppress(threading.BrokenBarrierError):
                gate.wait()  # all workers busy at once: the pool is as large as it gets

    await asyncio.gather(*(asyncio.to_thread(work) for _ in range(4 * WORKER_THREADS)))
    assert len(seen) == WORKER_THREADS


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_glibc_accepts_the_malloc_settings() -> None:
    import subprocess

    # in a process of its own: the settings are for the registry process, not the test runner
    code = "from toolbus_registry.memory import limit_arenas; print(limit_arenas())"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "True"
