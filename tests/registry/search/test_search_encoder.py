"""The numpy MiniLM encoder reproduces all-MiniLM-L6-v2 and behaves like a sentence encoder."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from toolbus_registry.search.encoder import Encoder, bundled_model_directory, default_encoder


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


def test_the_token_table_read_from_the_model_file_gives_the_same_vectors_as_in_memory() -> None:
    # The registry's encoder reads the rows of the token table it needs from the model file and
    # quantizes each as it is read, instead of holding the whole table quantized in memory.
    from_file = default_encoder()
    assert type(from_file._word).__name__ == "_FileTokenRows"
    in_memory = Encoder.from_directory(bundled_model_directory(), token_table_in_memory=True)
    assert type(in_memory._word).__name__ == "_TokenRows"
    texts = [
        "close a GitHub issue",
        "send an SMS to +1 555 0100 with the verification code",
        "naïve café 東京 🩷 [MASK] résumé",
        "list the open issues of repository number 7 " * 20,
    ]
    assert np.array_equal(from_file.encode(texts, batch_size=2), in_memory.encode(texts, batch_size=2))
    for text in texts:
        assert np.array_equal(from_file.encode([text]), in_memory.encode([text]))
