"""BM25F over the fields of a tool: its own name, its server or namespace, its description and its
parameters, each with a weight, so that a word in a tool's name counts for more than the same word
deep in a parameter's description.

Postings are numpy arrays holding each term's finished contribution (idf times saturated field-
weighted frequency), so a query costs one vectorised add per query term: well under a
millisecond for 10,000 tools.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Field:
    """One field of BM25F: its weight and how strongly its length normalises (b)."""

    weight: float
    b: float


@dataclass(frozen=True)
class Bm25Params:
    k1: float = 1.2
    fields: Mapping[str, Field] | None = None

    def field_specs(self) -> Mapping[str, Field]:
        return self.fields if self.fields is not None else DEFAULT_FIELDS


DEFAULT_FIELDS: Mapping[str, Field] = {
    "name": Field(weight=3.0, b=0.3),
    "server": Field(weight=1.0, b=0.0),
    "description": Field(weight=1.0, b=0.75),
    "params": Field(weight=0.3, b=0.75),
}


class LexicalIndex:
    """An immutable BM25F index over documents given as {field: terms}."""

    def __init__(self, docs: Sequence[Mapping[str, Sequence[str]]], params: Bm25Params | None = None) -> None:
        params = params or Bm25Params()
        specs = params.field_specs()
        n = len(docs)
        self.size = n
        avg_len = {f: max(sum(len(d.get(f, ())) for d in docs) / n, 1.0) if n else 1.0 for f in specs}
        # Every occurrence of a term as integers (its term, and its slot: one document's field),
        # then numpy counts, weights and sums them (a Counter and a dict a document cost ~2x
        # more on 1,000 tools); only mapping words to ids is a Python loop.
        occ_words: list[str] = []
        occ_slots: list[int] = []
        slot_docs: list[int] = []
        slot_fields: list[int] = []
        shares: list[float] = []
        for k, (f, spec) in enumerate(specs.items()):
            for doc_id, doc in enumerate(docs):
                words = doc.get(f, ())
                if not words:
                    continue
                norm = 1.0 - spec.b + spec.b * len(words) / avg_len[f]
                occ_slots.extend([len(shares)] * len(words))
                shares.append(spec.weight / norm)
                slot_docs.append(doc_id)
                slot_fields.append(k)
                occ_words.extend(words)
        term_ids = {w: i for i, w in enumerate(dict.fromkeys(occ_words))}
        occ_terms = list(map(term_ids.__getitem__, occ_words))
        vocab, n_fields = max(len(term_ids), 1), len(specs)
        slots = np.asarray(occ_slots, dtype=np.int64)
        # One key per (document, term, field), sorted so: each (document, term) then sums its
        # fields in `specs` order, as the loop over fields did (bit-identical scores).
        keys = (
            np.asarray(slot_docs, dtype=np.int64)[slots] * vocab + np.asarray(occ_terms, dtype=np.int64)
        ) * n_fields
        keys += np.asarray(slot_fields, dtype=np.int64)[slots]
        unique, first, counts = np.unique(keys, return_index=True, return_counts=True)
        weighted = np.asarray(shares, dtype=np.float64)[slots[first]] * counts
        pairs, starts = np.unique(unique // n_fields, return_index=True)
        tf_all = np.add.reduceat(weighted, starts) if pairs.size else weighted
        pair_terms = pairs % vocab
        # Postings of every term at once (vectorised: per-term arrays cost ~3x more on 1,000 tools).
        order = np.argsort(pair_terms, kind="stable")
        df = np.bincount(pair_terms, minlength=len(term_ids)).astype(np.float64)
        idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
        tf_arr = tf_all[order]
        contrib = (idf[pair_terms[order]] * tf_arr * (params.k1 + 1.0) / (tf_arr + params.k1)).astype(
            np.float32
        )
        self._ids = (pairs[order] // vocab).astype(np.int32)
        self._contrib = contrib
        # Each term's postings are one span of the two arrays (sliced when a query uses the term:
        # 10,000 small arrays cut up front cost more than the rest of the build).
        ends = np.cumsum(df.astype(np.int64)).tolist()
        self._spans: dict[str, tuple[int, int]] = dict(
            zip(term_ids, zip([0, *ends[:-1]] if ends else [], ends, strict=True), strict=True)
        )

    def __contains__(self, term: str) -> bool:
        return term in self._spans

    def scores(
        self, groups: Sequence[Mapping[str, float]], coordination: float = 1.0
    ) -> npt.NDArray[np.float32]:
        """The BM25F score of every document for a query given as groups of {term: weight} (one
        group per query word: the word and its synonyms), multiplied by the share of groups the
        document matches raised to `coordination`: a tool that matches "close" and "issue" beats
        one that matches "close" alone, however short its name."""
        out = np.zeros(self.size, dtype=np.float32)
        if not groups:
            return out
        matched = np.zeros(self.size, dtype=np.float32)
        for group in groups:
            hit = np.zeros(self.size, dtype=np.float32)
            for term, weight in group.items():
                span = self._spans.get(term)
                if span is not None:
                    ids, contrib = self._ids[span[0] : span[1]], self._contrib[span[0] : span[1]]
                    out[ids] += np.float32(weight) * contrib
                    hit[ids] = np.maximum(hit[ids], np.float32(min(weight, 1.0)))
            matched += hit
        if coordination:
            out *= (matched / np.float32(len(groups))) ** np.float32(coordination)
        return out
