"""The vectorised BM25F index build against the plain per-document loop it replaced, and the
schema walk's text (parameter names, descriptions, enums; depth and length limits)."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
from toolbus_registry.search.index import _schema_text
from toolbus_registry.search.lexical import Bm25Params, LexicalIndex

WORDS = [f"w{i}" for i in range(40)]
FIELDS = ("name", "server", "description", "params")


def reference_postings(
    docs: Sequence[Mapping[str, Sequence[str]]], params: Bm25Params
) -> dict[str, dict[int, float]]:
    """BM25F as a loop over documents and fields, summing each term's fields in field order."""
    specs = params.field_specs()
    n = len(docs)
    avg = {f: max(sum(len(d.get(f, ())) for d in docs) / n, 1.0) for f in specs}
    tfs: list[dict[str, float]] = []
    for doc in docs:
        weighted: dict[str, float] = {}
        for f, spec in specs.items():
            words = doc.get(f, ())
            if not words:
                continue
            share = spec.weight / (1.0 - spec.b + spec.b * len(words) / avg[f])
            for w, count in Counter(words).items():
                weighted[w] = weighted.get(w, 0.0) + share * count
        tfs.append(weighted)
    df = Counter(w for weighted in tfs for w in weighted)
    out: dict[str, dict[int, float]] = {}
    for doc_id, weighted in enumerate(tfs):
        for w, tf in weighted.items():
            idf = math.log(1.0 + (n - df[w] + 0.5) / (df[w] + 0.5))
            out.setdefault(w, {})[doc_id] = float(np.float32(idf * tf * (params.k1 + 1.0) / (tf + params.k1)))
    return out


def test_the_vectorised_build_gives_the_loops_scores_bit_for_bit() -> None:
    rng = random.Random(7)
    docs = [
        {f: [rng.choice(WORDS) for _ in range(rng.randrange(0, 12))] for f in FIELDS if rng.random() > 0.1}
        for _ in range(300)
    ]
    params = Bm25Params()
    index = LexicalIndex(docs, params)
    expected = reference_postings(docs, params)
    for word in WORDS:
        scores = index.scores([{word: 1.0}], coordination=0.0)
        want = np.zeros(len(docs), dtype=np.float32)
        for doc_id, value in expected.get(word, {}).items():
            want[doc_id] = value
        assert np.array_equal(scores, want), word
        assert (word in index) == (word in expected)


def test_an_empty_index_and_empty_documents_score_zero() -> None:
    assert LexicalIndex([]).scores([{"x": 1.0}]).shape == (0,)
    assert LexicalIndex([{"name": []}, {}]).scores([{"x": 1.0}]).tolist() == [0.0, 0.0]


def test_schema_text_reads_names_descriptions_and_enums_to_depth_four() -> None:
    def nest(depth: int) -> dict[str, object]:
        if depth == 0:
            return {"type": "string", "description": "deepest"}
        return {
            "type": "object",
            "description": f"level{depth}",
            "properties": {f"p{depth}": nest(depth - 1)},
        }

    schema = {
        "type": "object",
        "description": "the root's own description is not a parameter's",
        "properties": {
            "state": {"type": "string", "enum": ["open", "closed", 3], "description": "New state."},
            "labels": {"type": "array", "items": {"type": "string", "description": "A label."}},
            "either": {"anyOf": [{"type": "string", "description": "a name"}, True]},
            "deep": nest(6),
        },
    }
    text = _schema_text(schema, 2000)
    assert text.startswith("state New state. open closed labels A label. either a name deep level6 p6")
    assert "root" not in text
    # The root is depth 0: keys of the node at depth 4 are read, nothing below them.
    assert "p3" in text and "level2" not in text and "p2" not in text
    assert _schema_text(schema, 10) == text[:10]
