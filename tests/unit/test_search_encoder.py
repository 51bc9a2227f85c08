"""The numpy MiniLM encoder reproduces all-MiniLM-L6-v2 and behaves like a sentence encoder."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from toolbus_registry.search.encoder import default_encoder


def test_matches_reference_similarities_of_all_minilm_l6_v2() -> None:
    # The sentence-transformers quickstart prints these cosine similarities for this model
    # (computed with torch): 0.6660, 0.1046, 0.1411. The weights are int8 here (the float32
    # encoder was within 2e-3, the int8 one is within 2.5e-3 on these three pairs).
    vectors = default_encoder().encode(
        ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    )
    sims = vectors @ vectors.T
    assert np.allclose(np.diag(sims), 1.0, atol=1e-5)
    assert abs(sims[0, 1] - 0.6660) < 4e-3
    assert abs(sims[0, 2] - 0.1046) < 4e-3
    assert abs(sims[1, 2] - 0.1411) < 4e-3


def test_paraphrases_score_far_above_unrelated_sentences() -> None:
    a, b, c = default_encoder().encode(
        ["close a GitHub issue", "mark the bug report on GitHub as resolved", "resize the browser window"]
    )
    assert float(a @ b) > float(a @ c) + 0.2


def test_batching_and_padding_do_not_change_embeddings() -> None:
    encoder = default_encoder()
    texts = ["short", "a much longer sentence that needs many more word pieces than the first one"]
    together = encoder.encode(texts, batch_size=2)
    alone = np.stack([encoder.encode([t])[0] for t in texts])
    assert together.shape == (2, encoder.dim)
    assert np.allclose(together, alone, atol=1e-5)
    assert encoder.encode([]).shape == (0, encoder.dim)


def test_encodings_on_concurrent_threads_match_sequential_ones() -> None:
    # Each forward pass widens the weights into a buffer of its own (one is kept for the next
    # pass): passes on two threads at once must not share one.
    encoder = default_encoder()
    texts = [f"list the open issues of repository number {i}" for i in range(12)]
    alone = [encoder.encode([t])[0] for t in texts]
    with ThreadPoolExecutor(max_workers=3) as pool:
        together = list(pool.map(lambda t: encoder.encode([t])[0], texts * 3))
    for k, vector in enumerate(together):
        assert np.array_equal(vector, alone[k % len(texts)])
