"""Fit the head re-ranker's weights (`RerankWeights`) on the even-indexed labelled tasks of both
corpora, and print the figures of both halves (the odd half held out).

    uv run python bench/search_fit.py [--l2 0.03] [--head 40]

For each task, the fused head of the current index (`SearchIndex.head_features`) is a list of
candidates with their features. A listwise logistic regression (softmax over the head, the
task's accepted tools as the target; standardised features, L2, plain gradient descent in numpy)
is fitted on the even half, scaled so that `cosine` weighs 1, then each weight is moved by ±0.05
and ±0.02 while the even half's top-1 + recall@5 / 2 (summed over both corpora) rises. Vectors
come from the tests' cache (.cache/search-vectors), so a run after the tests embeds nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from toolbus_registry.search import SearchOptions
from toolbus_registry.search.index import FEATURES, RerankWeights

from tests.registry.search.labelled import load_queries, load_tools, load_twilio_tasks
from tests.registry.search.openapi_corpus import load_large_corpus
from tests.registry.search.support import cached_embedder, embedded_index

Task = tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]


def tasks(label: str, head: int) -> list[Task]:
    tools, queries = (
        (load_tools(), load_queries()) if label == "small" else (load_large_corpus(), load_twilio_tasks())
    )
    embedder = cached_embedder()
    index = embedded_index(tools, embedder, SearchOptions(head=head))
    out = []
    for q in queries:
        ids, features = index.head_features(q.query, embedder.encode_query(q.query))
        out.append((features, np.asarray([index.tools[i].name in q.accept for i in ids.tolist()])))
    return out


def figures(weights: npt.NDArray[np.float64], rows: list[Task], parity: int | None) -> tuple[float, float]:
    top1 = recall5 = n = 0
    for k, (features, accepted) in enumerate(rows):
        if parity is not None and k % 2 != parity:
            continue
        order = np.argsort(-(features @ weights), kind="stable")
        n += 1
        top1 += int(accepted[order[0]])
        recall5 += int(accepted[order[:5]].any())
    return top1 / n, recall5 / n


def fit_listwise(
    rows: list[Task], l2: float, epochs: int = 600, rate: float = 0.5
) -> npt.NDArray[np.float64]:
    train = [(f.astype(np.float64), a) for f, a in rows if a.any()]
    stacked = np.concatenate([f for f, _ in train])
    mean, std = stacked.mean(axis=0), stacked.std(axis=0) + 1e-6
    w = np.zeros(len(FEATURES))
    for _ in range(epochs):
        grad = np.zeros_like(w)
        for features, accepted in train:
            z = (features - mean) / std
            s = z @ w
            p = np.exp(s - s.max())
            p /= p.sum()
            grad += z.T @ (p - accepted / accepted.sum())
        w -= rate * (grad / len(train) + l2 * w)
    raw = w / std
    scaled: npt.NDArray[np.float64] = raw / raw[FEATURES.index("cosine")]
    return scaled


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--l2", type=float, default=0.03)
    parser.add_argument("--head", type=int, default=SearchOptions().head)
    args = parser.parse_args()
    corpora = {label: tasks(label, args.head) for label in ("small", "large")}
    even = [row for rows in corpora.values() for row in rows[0::2]]
    w = fit_listwise(even, args.l2)

    def objective(v: npt.NDArray[np.float64]) -> float:
        total = 0.0
        for rows in corpora.values():
            top1, recall5 = figures(v, rows, 0)
            total += top1 + recall5 / 2
        return total

    best = objective(w)
    for step in (0.05, 0.02):
        improved = True
        while improved:
            improved = False
            for j, name in enumerate(FEATURES):
                if name == "cosine":
                    continue
                for delta in (step, -step):
                    trial = w.copy()
                    trial[j] += delta
                    value = objective(trial)
                    if value > best + 1e-9:
                        best, w, improved = value, trial, True
    shipped = RerankWeights().vector().astype(np.float64)
    print("fitted:  ", {f: round(float(x), 3) for f, x in zip(FEATURES, w, strict=True)})
    print("shipped: ", dataclasses.asdict(RerankWeights()))
    for label, rows in corpora.items():
        for name, weights in (("fitted", w), ("shipped", shipped)):
            cells = [figures(weights, rows, p) for p in (0, 1, None)]
            print(
                f"{label:5} {name:7} "
                + "  ".join(
                    f"{part} {t:.3f} / {r:.3f}"
                    for part, (t, r) in zip(("even", "odd", "all"), cells, strict=True)
                )
            )


if __name__ == "__main__":
    main()
