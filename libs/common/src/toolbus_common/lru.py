"""A least-recently-used map bounded by total weight (by default, by count)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


def _one(_key: object, _value: object) -> int:
    return 1


class Lru(Generic[K, V]):
    """Entries by key, the least recently used dropped first once their weights sum past
    `capacity`. The newest entry is always kept, even one heavier than the capacity alone."""

    def __init__(self, capacity: int, weight: Callable[[K, V], int] = _one) -> None:
        self._capacity = capacity
        self._weight = weight
        self._used = 0
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value of `key` (now the most recently used), or None."""
        hit = self._items.get(key)
        if hit is not None:
            self._items.move_to_end(key)
        return hit

    def put(self, key: K, value: V) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self._used -= self._weight(key, old)
        self._items[key] = value
        self._used += self._weight(key, value)
        while self._used > self._capacity and len(self._items) > 1:
            dropped_key, dropped = self._items.popitem(last=False)
            self._used -= self._weight(dropped_key, dropped)

    def pop(self, key: K) -> V | None:
        """Remove `key`; its value, or None."""
        old = self._items.pop(key, None)
        if old is not None:
            self._used -= self._weight(key, old)
        return old

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)
